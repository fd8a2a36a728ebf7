-- Causal document masking with per-document logical positions.
--
-- Several documents are packed into one sequence (sequence packing). A token attends only to
-- tokens of its own document, causally -- and the first `prefix` tokens of every document (its
-- prompt, say) are visible to the whole document, as in a per-document prefix-LM. "First" is
-- counted from the document's start, so the mask needs each token's logical position
-- q - offsets[b][doc[b][q]], a load indexed by another load.
--
-- Source: FlexAttention's document-masking recipe (PyTorch blog "FlexAttention: The Flexibility
-- of PyTorch with the Performance of FlashAttention", 2024), which converts a mask written for
-- one document into one over packed documents with document ids and offsets.
--
-- Aux tensors:  doc[b][i]      the document id of token i (sorted: 0, 0, 1, 1, 1, 2, ...)
--               offsets[b][d]  the position where document d starts

-- Both fills cut the sequence at the same random points, so doc and offsets agree.
local function cuts(len, seed)
  math.randomseed(seed)
  local starts = {0}
  for _ = 1, math.random(2, 5) do
    starts[#starts + 1] = math.random(1, len - 1)
  end
  table.sort(starts)
  return starts
end

local function fill_doc(shape, seed)
  local rows, len, out = shape[1], shape[2], {}
  for r = 0, rows - 1 do
    local starts, d = cuts(len, seed + r), 0
    for i = 0, len - 1 do
      while starts[d + 2] and i >= starts[d + 2] do d = d + 1 end
      out[#out + 1] = d
    end
  end
  return out
end

local function fill_offsets(shape, seed)
  local rows, len, out = shape[1], shape[2], {}
  for r = 0, rows - 1 do
    local starts = cuts(len, seed + r)
    for d = 0, len - 1 do
      out[#out + 1] = starts[d + 1] or len -- unused entries: past the end
    end
  end
  return out
end

return kpt.pattern{
  name = "document_logical",
  params = { prefix = 16 },
  aux = {
    doc = { dtype = "int32", shape = {"b", "sq"}, fill = fill_doc },
    offsets = { dtype = "int32", shape = {"b", "sq"}, fill = fill_offsets },
  },
  mask = function(b, h, q, k, p)
    local dq, dk = p.doc[b][q], p.doc[b][k]
    local q_pos = q - p.offsets[b][dq]
    local k_pos = k - p.offsets[b][dk]
    return dq:eq(dk) & (q_pos:ge(k_pos) | k_pos:lt(p.prefix))
  end,
}
