-- PrefixLM: a bidirectional prefix followed by causal generation.
--
-- The first `prefix` tokens (the input) see each other in both directions; the tokens after
-- them (the output) are causal. The prefix length is a runtime scalar: each batch can set it
-- at launch without a recompile.
--
-- Source: Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
-- Transformer" (JMLR 2020), §3.2.1, "prefix LM"; the same as the built-in prefix_lm($prefix).

return kpt.pattern{
  name = "prefix_lm_lua",
  params = { prefix = kpt.runtime("prefix", 128) },
  mask = function(b, h, q, k, p)
    return k:lt(p.prefix) | q:ge(k)
  end,
}
