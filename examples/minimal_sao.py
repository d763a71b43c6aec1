"""Minimal synchronous SAO on 2-digit addition: the whole algorithm in one file.

SAO (Single-rollout Asynchronous Optimization, arXiv 2607.07508) trains on one rollout per
prompt, weights tokens with direct double-sided importance sampling (DIS) and replaces GRPO's
group baseline with a critic. This script runs it top to bottom on a tiny random-init Qwen3-style
model and a char-level tokenizer, on CPU, in about a minute:

1. Build a 2-layer, 128-wide dense Qwen3 model over saorl's char tokenizer (random init).
2. Supervised warm-up (`saorl.learner.sft`): a few hundred cross-entropy steps on "a+b=" ->
   "sum<eos>", so the policy starts weak but not hopeless (held-out greedy accuracy ~20-40%).
3. Copy the policy into a critic (`Critic`: same backbone, zero-init value head) and freeze
   the critic's attention (`freeze_attention`); critic lr = 5x policy lr.
4. Each RL step:
   a. sample ONE rollout for each of B distinct training prompts from the current policy
      (`HFEngine`, temperature 1), score it with the verifiable 0/1 reward, build a `Batch`;
   b. critic values on the batch, computed before any critic update on it;
   c. skip-observation GAE: length-adaptive lambda = 1 - 1/(1.5 l) for the policy advantages,
      lambda = 1 for the critic's targets, gamma = 1;
   d. K = 2 critic optimizer steps on the value loss 0.5 (V - R)^2;
   e. unless still in critic warm-up, ONE policy step on the DIS loss (eps_low 0.3, eps_high 5.0).
5. Report the sampled reward of every step and held-out greedy accuracy before and after RL.

Departures from the paper (all for a CPU demo that finishes in a minute):
- Synchronous: rollouts come from the current weights, so the DIS ratio is ~1 up to numerics
  and the band never masks anything. The asynchronous pipeline (stale rollouts, partial
  rollouts, admission control) is `saorl.loop` (docs/design.md section 2); the per-step math is
  the same.
- No value pre-training corpus: the critic only gets `--critic-warmup-steps` critic-only
  steps (paper: 10) on fresh rollouts of the initial policy before the first policy step.
- Tiny scale: B = 64 prompts per step (paper: 128), policy lr 5e-5 (paper: 1e-6 for 7B+
  models), 60 steps, and a supervised warm-up instead of a pre-trained checkpoint.
- No KL and no entropy term, as in the paper.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from saorl.advantages import length_adaptive_lambda, skip_observation_gae
from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.envs.arithmetic import ArithmeticTask, Problem
from saorl.learner.optim import adamw
from saorl.learner.sft import encode_demos, sft_step
from saorl.losses import dis_policy_loss, value_loss
from saorl.models.critic import Critic, freeze_attention
from saorl.models.logprobs import sequence_logprobs
from saorl.models.tokenizer import build_char_tokenizer
from saorl.types import Batch, Trajectory

MAX_NEW_TOKENS = 6  # a 2-digit sum has at most 3 digits + EOS; a little slack to go wrong
MAX_SEQ_LEN = 16  # "99+99=" (6) + 6 new tokens fits with room to spare


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="RL steps with a policy update")
    p.add_argument(
        "--critic-warmup-steps",
        type=int,
        default=5,
        help="critic-only steps before the first policy step (paper: 10)",
    )
    p.add_argument("--sft-steps", type=int, default=600, help="supervised warm-up steps")
    p.add_argument("--sft-lr", type=float, default=1e-3, help="supervised warm-up AdamW lr")
    p.add_argument("--sft-batch-size", type=int, default=64, help="demos per warm-up step")
    p.add_argument("--batch-size", type=int, default=64, help="prompts (= rollouts) per RL step")
    # Measured on this task: 5e-5 and 1e-4 raise reward, 3e-4 and above lower it (Adam takes
    # ~lr-sized steps whatever the gradient's signal-to-noise, and 64 single rollouts are noisy).
    p.add_argument("--lr", type=float, default=5e-5, help="policy AdamW lr (paper: 1e-6)")
    p.add_argument(
        "--critic-lr-mult", type=float, default=5.0, help="critic lr / policy lr (paper: 5)"
    )
    p.add_argument("--critic-updates", type=int, default=2, help="critic steps per RL step (K)")
    p.add_argument("--eps-low", type=float, default=0.3, help="DIS band: r > 1 - eps_low")
    p.add_argument("--eps-high", type=float, default=5.0, help="DIS band: r < 1 + eps_high")
    p.add_argument("--lambda-alpha", type=float, default=1.5, help="adaptive lambda alpha (VAPO)")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature")
    p.add_argument("--eval-size", type=int, default=256, help="held-out problems for accuracy")
    p.add_argument("--seed", type=int, default=0, help="seeds torch, the sampler and prompts")
    # One thread: a 0.5M-parameter model gains little from a second one, and when another
    # process shares a 2-core machine, two OpenMP threads spin-wait and run ~10x slower.
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = default)")
    return p.parse_args(argv)


def build_policy(tokenizer: PreTrainedTokenizerBase) -> Qwen3ForCausalLM:
    """A random-init dense Qwen3 causal LM sized for a CPU demo (~0.5M parameters)."""
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_SEQ_LEN,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(config)


def supervised_warmup(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    task: ArithmeticTask,
    rng: random.Random,
    steps: int,
    lr: float,
    batch_size: int,
) -> float:
    """Teach the answer format and some addition; returns the last step's NLL."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    nll = float("nan")
    for _ in range(steps):
        problems = [task.sample(rng) for _ in range(batch_size)]
        demos = encode_demos(tokenizer, [q.prompt for q in problems], [q.answer for q in problems])
        nll = sft_step(model, opt, demos)
    return nll


def score(
    tokenizer: PreTrainedTokenizerBase, problem: Problem, token_ids: list[int], finish: str
) -> float:
    # The answer is "the sum followed by EOS": a completion cut off by the length budget
    # never ended its answer, so it scores 0 even if its digits happen to be right.
    if finish != "eos":
        return 0.0
    return ArithmeticTask.reward(problem, tokenizer.decode(token_ids, skip_special_tokens=True))


def requests_for(
    tokenizer: PreTrainedTokenizerBase, problems: list[Problem], greedy: bool
) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            prompt_ids=tokenizer.encode(q.prompt, add_special_tokens=False),
            max_new_tokens=MAX_NEW_TOKENS,
            request_id=i,
            greedy=greedy,
            payload=q,
        )
        for i, q in enumerate(problems)
    ]


@torch.no_grad()
def greedy_accuracy(
    engine: HFEngine, tokenizer: PreTrainedTokenizerBase, problems: list[Problem]
) -> float:
    """Fraction of held-out problems the policy answers exactly with greedy decoding."""
    done = engine.generate(requests_for(tokenizer, problems, greedy=True))
    hits = [score(tokenizer, c.request.payload, c.token_ids, c.finish_reason) for c in done]
    return sum(hits) / len(hits)


def collect(
    engine: HFEngine,
    tokenizer: PreTrainedTokenizerBase,
    task: ArithmeticTask,
    rng: random.Random,
    batch_size: int,
) -> list[Trajectory]:
    """One rollout for each of `batch_size` distinct prompts (SAO: no groups)."""
    problems: dict[str, Problem] = {}
    while len(problems) < batch_size:
        q = task.sample(rng)
        problems[q.key] = q
    trajs = []
    for c in engine.generate(requests_for(tokenizer, list(problems.values()), greedy=False)):
        q = c.request.payload
        trajs.append(
            Trajectory(
                prompt_ids=c.request.prompt_ids,
                completion_ids=c.token_ids,
                loss_mask=[1] * len(c.token_ids),  # single-turn: every token is an action
                rollout_logprobs=c.logprobs,
                versions=c.versions,
                reward=score(tokenizer, q, c.token_ids, c.finish_reason),
                stop_reason=c.finish_reason,
                prompt_key=q.key,
            )
        )
    return trajs


def optimizers(
    policy: Qwen3ForCausalLM, critic: Critic, args: argparse.Namespace
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """AdamW for the policy and for the critic's trainable (non-frozen) parameters, the
    critic's lr `--critic-lr-mult` times the policy's; no weight decay."""
    policy_opt = adamw(list(policy.parameters()), lr=args.lr, weight_decay=0.0)
    critic_params = [p for p in critic.parameters() if p.requires_grad]
    critic_opt = adamw(critic_params, lr=args.lr * args.critic_lr_mult, weight_decay=0.0)
    return policy_opt, critic_opt


def sao_step(
    batch: Batch,
    policy: Qwen3ForCausalLM,
    critic: Critic,
    policy_opt: torch.optim.Optimizer,
    critic_opt: torch.optim.Optimizer,
    args: argparse.Namespace,
    update_policy: bool,
) -> dict[str, float]:
    """Critic values -> GAE -> K critic steps -> (maybe) one DIS policy step."""
    mask = batch.action_mask
    # Values before any critic update on this batch: a baseline must not have seen the
    # outcome it is compared with (docs/design.md section 1).
    critic.eval()
    with torch.no_grad():
        old_values = critic(batch.input_ids, batch.attention_mask) * mask
    lam_policy = length_adaptive_lambda(mask, alpha=args.lambda_alpha)
    advantages, _ = skip_observation_gae(batch.rewards, old_values, mask, 1.0, lam_policy)
    # lambda = 1, gamma = 1: the critic regresses every action token on the final reward.
    _, returns = skip_observation_gae(batch.rewards, old_values, mask, 1.0, 1.0)
    _, vm = value_loss(old_values, returns, mask)
    metrics = {"value/explained_variance": vm["value/explained_variance"]}

    # K critic steps on the same batch: the paper's faster critic (section 3.2).
    critic.train()
    for _ in range(args.critic_updates):
        loss, vm = value_loss(critic(batch.input_ids, batch.attention_mask), returns, mask)
        critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
        critic_opt.step()
    metrics["loss/value"] = vm["loss/value"]

    if update_policy:
        policy.train()
        logprobs = sequence_logprobs(
            policy, batch.input_ids, batch.attention_mask, temperature=args.temperature
        )
        loss, pm = dis_policy_loss(
            logprobs, batch.rollout_logprobs, advantages, mask, args.eps_low, args.eps_high
        )
        policy_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        policy_opt.step()
        metrics.update({k: pm[k] for k in ("loss/policy", "dis/masked_frac", "dis/ratio_mean")})
    return metrics


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run warm-up, then SAO; return accuracies before/after and the reward of every step."""
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()

    tokenizer = build_char_tokenizer()
    task = ArithmeticTask(num_digits=2, eval_size=args.eval_size)
    policy = build_policy(tokenizer)
    n_params = sum(p.numel() for p in policy.parameters())
    print(f"policy: {n_params / 1e6:.2f}M params, vocab {len(tokenizer)}")

    nll = supervised_warmup(
        policy, tokenizer, task, rng, args.sft_steps, args.sft_lr, args.sft_batch_size
    )
    # copy_model=False: the engine samples from the training model itself, so every rollout
    # is on-policy (synchronous SAO) and no weight push is needed.
    engine = HFEngine(
        policy,
        tokenizer,
        EngineSettings(
            max_seq_len=MAX_SEQ_LEN,
            temperature=args.temperature,
            max_concurrent=max(args.batch_size, args.eval_size),
            seed=args.seed,
        ),
        copy_model=False,
    )
    acc0 = greedy_accuracy(engine, tokenizer, task.held_out)
    print(
        f"sft: {args.sft_steps} steps, nll {nll:.3f}, held-out greedy accuracy {acc0:.3f} "
        f"({time.perf_counter() - t0:.1f}s)"
    )

    # The critic starts from the warmed-up policy (paper: initialised from the policy
    # checkpoint) and trains everything except attention, 5x faster than the policy.
    critic = Critic(policy)
    frozen = freeze_attention(critic)
    policy_opt, critic_opt = optimizers(policy, critic, args)
    critic_params = [p for p in critic.parameters() if p.requires_grad]
    print(
        f"critic: {len(frozen)} attention tensors frozen, "
        f"{sum(p.numel() for p in critic_params) / 1e6:.2f}M trainable"
    )

    warmup_rewards: list[float] = []
    rewards: list[float] = []
    t_rl = time.perf_counter()
    for step in range(args.critic_warmup_steps + args.steps):
        warmup = step < args.critic_warmup_steps
        version = max(0, step - args.critic_warmup_steps)  # = policy steps taken so far
        engine.version = version
        batch = Batch.from_trajectories(
            collect(engine, tokenizer, task, rng, args.batch_size), tokenizer.pad_token_id
        )
        m = sao_step(batch, policy, critic, policy_opt, critic_opt, args, not warmup)
        reward = float(batch.scores.mean())
        (warmup_rewards if warmup else rewards).append(reward)
        tag = "critic-warmup" if warmup else f"step {version + 1:3d}"
        # One batch's reward is noisy (std ~0.05 at B=64); the mean of the last 10 shows the trend.
        recent = (warmup_rewards if warmup else rewards)[-10:]
        extra = "" if warmup else f"  dis_masked {m['dis/masked_frac']:.3f}"
        ev = m["value/explained_variance"]
        print(
            f"{tag}  reward {reward:.3f}  (last10 {sum(recent) / len(recent):.3f})  "
            f"value_loss {m['loss/value']:.4f}  ev {ev:+.3f}{extra}"
        )

    acc1 = greedy_accuracy(engine, tokenizer, task.held_out)
    wall = time.perf_counter() - t0
    rl_s = time.perf_counter() - t_rl
    print(f"held-out greedy accuracy {acc0:.3f} -> {acc1:.3f}; RL {rl_s:.1f}s, total {wall:.1f}s")
    return {
        "initial_accuracy": acc0,
        "final_accuracy": acc1,
        "warmup_rewards": warmup_rewards,
        "rewards": rewards,
        "wall_s": wall,
    }


if __name__ == "__main__":
    main()
