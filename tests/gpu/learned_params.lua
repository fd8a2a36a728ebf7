-- Learnable score-mod parameters for the backward matrix (tests/gpu/run_backward.sh): every way
-- the CUDA backward gathers aux gradients.
--   slopes[h]  f32: every pair of a head adds into one element (a warp's lanes agree: the warp
--              sums its terms before its one atomic)
--   gain[h]    bf16: a derivative that depends on s (the kernel recomputes the scores for it)
--   near[d]    f32, 16 entries for d = k - q + 8: pairs farther apart read past either end,
--              get 0 and add no gradient
return kpt.pattern{
  name = "learned_params",
  aux = {
    slopes = { dtype = "float32", shape = {"hq"}, fill = kpt.range(0, 0.1) },
    gain = { dtype = "bfloat16", shape = {"hq"}, fill = kpt.range(-0.5, 0.5) },
    near = { dtype = "float32", shape = {16}, fill = kpt.range(-1, 1) },
  },
  score = function(s, b, h, q, k, p)
    local dist = kpt.float(kpt.abs(k - q))
    return s * (1 + p.gain[h]) - p.slopes[h] * dist + p.near[k - q + 8]
  end,
  mask = function(b, h, q, k, p)
    return q:ge(k)
  end,
}
