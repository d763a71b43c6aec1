"""The learner: the policy, its critic, their optimizers, and one SAO step per batch.

- `learner.py`: `Learner` (one process), `policy_step.py`: its policy update (a function of
  the state the learner hands it); `optim.py`: the optimizers (fused AdamW, the offloaded one);
- `critic_updater.py`: the critic's values, GAE and K updates;
- `sharding.py`: how a step's work is spread over processes (one here; FSDP2 in distributed/);
- `sft.py`, `value_pretrain.py`: supervised warm-up; critic pre-training.
"""
