-- A causal window whose width grows with the query head (37, 74, 111, ... keys): a mask that
-- differs per head. The serving kernels hold several query heads of one kv head in one CTA or
-- workgroup, so their tile classes must hold for every head there (tests/gpu/paged_check.c).

return kpt.pattern{
  name = "per_head_window",
  mask = function(b, h, q, k)
    local back = q - k
    return back:ge(0) & back:lt((h + 1) * 37)
  end,
}
