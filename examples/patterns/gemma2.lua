-- A Gemma 2 local-attention layer: logit soft-capping plus a causal sliding window.
--
-- Gemma 2 alternates global layers with local ones that see the last 4096 tokens, and caps
-- attention logits smoothly at +-50 with cap * tanh(s / cap).
--
-- Source: Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size" (2024),
-- §2 (Table 1: sliding window 4096, attention logit soft-cap 50).

return kpt.pattern{
  name = "gemma2_local",
  params = { window = 4096, cap = 50.0 },
  score = function(s, b, h, q, k, p)
    return p.cap * kpt.tanh(s / p.cap)
  end,
  mask = function(b, h, q, k, p)
    return q:ge(k) & (q - k):lt(p.window)
  end,
}
