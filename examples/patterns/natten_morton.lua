-- NATTEN with tokens in Morton (Z-order) order: 2-D neighbourhood attention on a side x side
-- canvas (side a power of two) whose pixels are numbered along the Z curve, so that nearby
-- pixels get nearby token numbers and the live tiles cluster near the diagonal.
--
-- A token's x and y are the even and the odd bits of its number; `compact` gathers every other
-- bit with Lua's integer bit operators, which trace into the IR's i32 bit ops. The window is
-- kernel x kernel, shifted inwards at the borders as in natten_2d.lua.
--
-- Sources: Morton, "A computer oriented geodetic data base and a new technique in file
-- sequencing" (IBM, 1966) for the order; Hassani et al., "Neighborhood Attention Transformer"
-- (CVPR 2023) for the window.

-- the even bits of v, packed: ...b4 b2 b0
local function compact(v)
  v = v & 0x55555555
  v = (v | (v >> 1)) & 0x33333333
  v = (v | (v >> 2)) & 0x0F0F0F0F
  v = (v | (v >> 4)) & 0x00FF00FF
  return (v | (v >> 8)) & 0x0000FFFF
end

return kpt.pattern{
  name = "natten_morton",
  params = { side = 16, kernel = 7 },
  mask = function(b, h, q, k, p)
    local S, K = p.side, p.kernel
    assert(S > 0 and S & (S - 1) == 0, "side must be a power of two")
    local half = K // 2
    local qx, qy = compact(q), compact(q >> 1)
    local kx, ky = compact(k), compact(k >> 1)
    local x0 = kpt.clamp(qx - half, 0, S - K)
    local y0 = kpt.clamp(qy - half, 0, S - K)
    return kx:ge(x0) & kx:lt(x0 + K) & ky:ge(y0) & ky:lt(y0 + K)
  end,
}
