-- Chunked causal attention (Llama 4's local layers).
--
-- The sequence is cut into chunks of `chunk` tokens; a token attends causally within its own
-- chunk only, so the cost per token is bounded by the chunk size.
--
-- Source: Meta's Llama 4 release (2025): its local attention layers use chunked attention with
-- 8192-token chunks. Equivalent to the built-ins chunked(C)+causal; written here with the
-- composition kpt.builtin offers.

return kpt.pattern{
  name = "chunked_causal",
  params = { chunk = 8192 },
  mask = function(b, h, q, k, p)
    return (q // p.chunk):eq(k // p.chunk) & kpt.builtin("causal")
  end,
}
