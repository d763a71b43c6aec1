#!/usr/bin/env bash
# The multi-node tier (tests/multinode_tier/): a Ray cluster of three nodes on this host
# (ray.cluster_utils.Cluster: a head and nodes with the custom resources learner_node and
# rollout_node), `saorl train --ray-address` with the learner and the rollout actors pinned to
# their nodes, and a rollout node and the learner's node lost mid-run. Runs in the main venv
# (.venv; Ray is in the dev extra).
#
#   bash scripts/test_multinode_tier.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SAORL_MULTINODE_TIER=1 .venv/bin/python -m pytest -m multinode tests/multinode_tier "$@"
