"""Policy and critic models: loading, the value head, frozen attention, chunked log-probs."""
