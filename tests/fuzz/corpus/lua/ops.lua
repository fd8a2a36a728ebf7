return kpt.pattern{
  params = { w = kpt.runtime("w", 64), c = 2.5 },
  aux = { t = { dtype = "float32", shape = {"hq", "any"} }, d = { dtype = "int32", shape = {"b", "sq"} } },
  score = function(s, b, h, q, k, p)
    return kpt.where(q:ge(k), s * p.c + p.t[h][q - k + kpt.skv], -s) // 2 % 3 ^ 0.5
  end,
  mask = function(b, h, q, k, p)
    return (q - k):lt(p.w) & ~p.d[b][q]:eq(p.d[b][k]) | kpt.builtin("causal")
  end,
}
