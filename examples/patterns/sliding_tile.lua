-- Sliding tile attention (STA): neighbourhood attention at the granularity of tiles, in 2-D or 3-D.
--
-- The canvas (frames x height x width pixels; frames = 1 for images) is cut into tiles of
-- tile_f x tile_h x tile_w pixels, and tokens are numbered tile by tile: the pixels of one tile
-- are consecutive tokens, tiles follow in row-major order (frame, row, column of tiles). A query
-- sees every key of the win_f x win_h x win_w tiles centred on its own tile, the window shifted
-- inwards at the borders (as NATTEN's). Because whole tiles are kept or dropped, the mask is
-- block-sparse at the tile size: with tiles of 64 tokens every 128 x 128 kernel tile is empty,
-- full or half full.
--
-- Source: Zhang et al., "Fast Video Generation with Sliding Tile Attention" (2025), §3.2.

return kpt.pattern{
  name = "sliding_tile",
  params = { frames = 1, height = 32, width = 32, tile_f = 1, tile_h = 8, tile_w = 8,
             win_f = 1, win_h = 3, win_w = 3 },
  mask = function(b, h, q, k, p)
    assert(p.frames % p.tile_f == 0 and p.height % p.tile_h == 0 and p.width % p.tile_w == 0,
           "the canvas must be a whole number of tiles")
    local nf, nh, nw = p.frames // p.tile_f, p.height // p.tile_h, p.width // p.tile_w
    assert(p.win_f <= nf and p.win_h <= nh and p.win_w <= nw, "the window must fit the canvas")
    local volume = p.tile_f * p.tile_h * p.tile_w
    -- a token's tile, as (frame, row, column) of tiles
    local function tile(t)
      local i = t // volume
      return i // (nh * nw), i // nw % nh, i % nw
    end
    local qf, qh, qw = tile(q)
    local kf, kh, kw = tile(k)
    local f0 = kpt.clamp(qf - p.win_f // 2, 0, nf - p.win_f)
    local h0 = kpt.clamp(qh - p.win_h // 2, 0, nh - p.win_h)
    local w0 = kpt.clamp(qw - p.win_w // 2, 0, nw - p.win_w)
    return kf:ge(f0) & kf:lt(f0 + p.win_f) & kh:ge(h0) & kh:lt(h0 + p.win_h)
           & kw:ge(w0) & kw:lt(w0 + p.win_w)
  end,
}
