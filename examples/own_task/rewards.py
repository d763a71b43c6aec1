"""Reward functions for examples/own_task.toml, written as for TRL's `reward_funcs`: a batch of
completions in, one float per completion out; dataset columns (`answer`) arrive as lists.
verl's `compute_score(data_source, solution_str, ground_truth, extra_info=None)` and saorl's
one-episode form (`completion`, a float) work unchanged too: docs/own-task.md."""


def correct(completions, answer, **kwargs):
    """1.0 when the reference answer appears in \\boxed{...}, else 0.0."""
    return [float(f"\\boxed{{{a}}}" in c) for c, a in zip(completions, answer, strict=True)]


def formatted(completions, **kwargs):
    """0.1 for any \\boxed{...} answer: a small reward for the format alone."""
    return [0.1 * ("\\boxed{" in c) for c in completions]
