"""The inference service: chat/generate with sampling, token logprobs, scoring and weight updates
(`orchard serve inference`)."""
