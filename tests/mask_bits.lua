-- A mask for the sm_90a kernels' stored keep bits (plan.mask_bits): long enough to be rolled
-- (over 24 IR nodes), different for every batch row and head (one map row each) and partial in
-- every tile, so that at shape 4,16,16,1500,1531 (12 x 12 tiles a row, 64 rows) the rows'
-- shares of slots (8192 / 64 = 128) run out at the eleventh q tile (the backward's at the
-- eleventh kv tile too): the last tiles evaluate their mask instead. tests/gpu/run.sh (forward)
-- and tests/gpu/run_backward.sh check it against the reference.

local function mix(v)
  v = v ~ (v >> 7)
  v = (v * 31) & 0xFFFF
  return v ~ (v >> 3)
end

return kpt.pattern{
  name = "mask_bits",
  mask = function(b, h, q, k)
    local t = mix(q * 3 + h) ~ mix(k * 5 + b * 7)
    return ((t & 3):ne(0) | (q - k):eq(0)) & (k - q):le(1200)
  end,
}
