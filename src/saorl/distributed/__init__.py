"""Scale-out: FSDP2 sharding of the learner, Ray actors and weight sync."""
