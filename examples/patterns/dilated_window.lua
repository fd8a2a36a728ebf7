-- Dilated sliding window (causal).
--
-- A query sees `window` keys behind it, spaced `dilation` apart: k = q, q - d, q - 2d, ...
-- Stacked layers with different dilations widen the receptive field without widening the
-- window.
--
-- Source: Longformer's dilated sliding window (Beltagy et al., 2020, §3.1), after the dilated
-- convolutions of WaveNet.

return kpt.pattern{
  name = "dilated_window",
  params = { window = 32, dilation = 2 },
  mask = function(b, h, q, k, p)
    local back = q - k
    return back:ge(0) & back:lt(p.window * p.dilation) & (back % p.dilation):eq(0)
  end,
}
