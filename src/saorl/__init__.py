"""saorl: asynchronous, agentic RL post-training of language models with SAO.

SAO is Single-rollout Asynchronous Optimization (arXiv 2607.07508). Importing the package does
no work and imports no torch; submodules are imported where used.
"""

__version__ = "0.1.0"
