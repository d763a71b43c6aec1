"""Generated coding tasks (`env.swe.source = "generated"`): a small repository built from
template modules, a bug injected by AST mutation, validated in the sandbox.

- `templates.py`: the template modules and their tests, read from package data
  (`template_files/<name>/PKG/<name>.py`, `template_files/<name>/tests/test_<name>.py`);
- `mutate.py`: single-point AST mutations, written back as minimal text edits;
- `generator.py`: `generate_pool(seed, ...)`, task `i` of a seed a pure function of
  `(seed, i)`, with a validation cache.
"""
