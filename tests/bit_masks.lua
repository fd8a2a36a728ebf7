-- Masks built from bit operations, for the soundness of the kernels' tile classification: the
-- interval and known-bits rules for bit operations (kpt_iv_band ... in the templates) decide
-- which tiles are skipped, so a rule that is not sound drops kept pairs and `kptc check` against
-- the reference fails. `which` picks one mask. tests/test_kptc.c runs them all on lavapipe (CI),
-- tests/gpu/run.sh on CUDA.
--
-- Negative operands, shifts by a key-dependent count and counts past 31, logical shifts of
-- negative values, shifts into the sign bit, xor with negatives and a Morton-style decode.

local masks = {
  function(q, k) return ((q ~ k) & 7):eq(0) | (q >> 4):eq(k >> 4) end,
  function(q, k) return ((q << 1) | 1):ge(k) & ((q - k) >> 31):eq(0) end,
  function(q, k) return (q:ashr(2) - k:ashr(2)):le(3) & (~k & 15):ne(0) end,
  function(q, k) return ((q ~ (k << 2)) & 0x1F0):eq(0) | (q >> (k & 3)):eq(k >> 2) end,
  function(q, k)
    return ((q - 200) & (k - 100)):ge(0) & (q << (k - 20)):ne(0) & (q:ashr(k - 300)):le(q)
  end,
  function(q, k) return (((k - 150) >> 3) & 0x1F0):eq((q >> 3) & 0x1F0) | ((q - k):ashr(2) & -4):eq(-8) end,
  function(q, k)
    return (~q & ~k & 0x55):eq(0) | ((q ~ -k) & 0x300):eq(0x100) | ((q | 0x40000000) << 1):eq(k - 9)
  end,
  function(q, k)
    return ((q & 0x55) | ((q >> 1) & 0x2A)):eq((k & 0x55) | ((k >> 1) & 0x2A)) & (~(q << 28)):lt(k)
  end,
}

return kpt.pattern{
  name = "bit_masks",
  params = { which = 1 },
  mask = function(b, h, q, k, p)
    assert(masks[p.which], "which must be 1 to " .. #masks)
    return masks[p.which](q, k)
  end,
}
