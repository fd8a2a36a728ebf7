-- Longformer: a bidirectional sliding window plus global tokens.
--
-- Every token attends to the tokens within `window` positions on either side. Global tokens
-- (a [CLS] token, question tokens) attend to everything and everything attends to them; which
-- tokens are global is data, given per batch row as a bool aux tensor.
--
-- Source: Beltagy, Peters and Cohan, "Longformer: The Long-Document Transformer" (2020), §3.1.
--
-- Aux tensor:  global[b][i]  true when token i is global

local function fill_global(shape, seed)
  math.randomseed(seed)
  local rows, len, out = shape[1], shape[2], {}
  for r = 0, rows - 1 do
    for i = 0, len - 1 do
      -- the first token, and about one token in 32
      out[r * len + i + 1] = i == 0 or math.random(32) == 1
    end
  end
  return out
end

return kpt.pattern{
  name = "longformer",
  params = { window = 64 },
  aux = {
    global = { dtype = "bool", shape = {"b", "sq"}, fill = fill_global },
  },
  mask = function(b, h, q, k, p)
    local near = kpt.abs(q - k):le(p.window)
    return near | p.global[b][q] | p.global[b][k]
  end,
}
