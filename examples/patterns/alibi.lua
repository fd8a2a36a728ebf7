-- ALiBi, written in Lua: a linear distance penalty per head instead of position embeddings.
--
-- Head h of n adds slope(h) * (k - q) to the score, slope(h) = 2^(-8 (h + 1) / n): a geometric
-- sequence from 2^(-8/n) down to 2^(-8). Causal, as in the paper's language models. The head
-- count n is the launch's (kpt.hq), so one kernel serves any head count. This is the paper's
-- formula for power-of-two head counts; the built-in `alibi` also handles the others.
--
-- Source: Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases Enables
-- Input Length Extrapolation" (ICLR 2022), §3.

return kpt.pattern{
  name = "alibi_lua",
  score = function(s, b, h, q, k, p)
    local slope = 2 ^ (-8 * (h + 1) / kpt.hq)
    return s + slope * (k - q)
  end,
  mask = function(b, h, q, k, p)
    return kpt.builtin("causal")
  end,
}
