-- NATTEN: 2-D neighbourhood attention on a width x height canvas.
--
-- Tokens are the pixels of an image in row-major order (token = y * width + x). A query sees the
-- kernel x kernel window centred on it; at the borders the window is shifted inwards rather
-- than cut, so every query sees exactly kernel * kernel keys.
--
-- Source: Hassani, Walton, Li, Li and Shi, "Neighborhood Attention Transformer" (CVPR 2023), §3;
-- the FlexAttention examples write the same mask.

return kpt.pattern{
  name = "natten_2d",
  params = { width = 16, height = 16, kernel = 7 },
  mask = function(b, h, q, k, p)
    local W, H, K = p.width, p.height, p.kernel
    local half = K // 2
    local qx, qy = q % W, q // W
    local kx, ky = k % W, k // W
    -- the window's first column and row, clamped so the window stays on the canvas
    local x0 = kpt.clamp(qx - half, 0, W - K)
    local y0 = kpt.clamp(qy - half, 0, H - K)
    return kx:ge(x0) & kx:lt(x0 + K) & ky:ge(y0) & ky:lt(y0 + K)
  end,
}
