"""Training recipes as plain torch functions, each module self-contained: `sft` (masked SFT, packing),
`ca_sft` (credit-assignment SFT), `rl` (GRPO, asymmetric clipping), `bar` (Balanced Adaptive Rollout),
`opd` (on-policy distillation losses) and `rpr` (rubric-based process reward mixing)."""
