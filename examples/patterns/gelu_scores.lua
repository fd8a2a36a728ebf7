-- Scores through the exact GELU, s * Phi(s) with Phi the standard normal CDF, written with
-- kpt.erf: negative scores are damped smoothly towards 0 before the softmax, large ones pass.
-- (The tanh approximation of GELU could always be written; the exact form needs erf.)
--
-- Source: Hendrycks and Gimpel, "Gaussian Error Linear Units (GELUs)" (2016), eq. 1; causal.

return kpt.pattern{
  name = "gelu_scores",
  mask = function(b, h, q, k)
    return q:ge(k)
  end,
  score = function(s)
    return s * 0.5 * (1 + kpt.erf(s / math.sqrt(2)))
  end,
}
