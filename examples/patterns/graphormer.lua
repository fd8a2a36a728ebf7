-- Graphormer spatial encoding: a learned bias per head and shortest-path distance.
--
-- Tokens are the nodes of a graph (one graph per batch row); the score of nodes i and j gets
-- bias[h][d], d = the length of the shortest path between them, capped at the table's last
-- entry. Distances are data: an int32 tensor per graph.
--
-- Source: Ying et al., "Do Transformers Really Perform Bad for Graph Representation?"
-- (NeurIPS 2021), §3.1.2, "Spatial Encoding".
--
-- Aux tensors:  dist[b][i][j]  int32 shortest-path distances, [B, N, N]
--               bias[h][d]     float32, [heads, MAX_DIST + 1]

local MAX_DIST = 15

-- Random graphs' distances are awkward to make here; distances on a ring of N nodes with a
-- random chord per graph are real shortest paths and cheap to compute.
local function fill_dist(shape, seed)
  math.randomseed(seed)
  local graphs, nq, nk, out = shape[1], shape[2], shape[3], {}
  local n = math.max(nq, nk) -- the ring's size (queries and keys are the same nodes)
  local function ring(x, y) local d = math.abs(x - y) return math.min(d, n - d) end
  for _ = 1, graphs do
    local a, c = math.random(0, n - 1), math.random(0, n - 1)
    for i = 0, nq - 1 do
      for j = 0, nk - 1 do
        out[#out + 1] = math.min(ring(i, j), ring(i, a) + 1 + ring(c, j), ring(i, c) + 1 + ring(a, j))
      end
    end
  end
  return out
end

return kpt.pattern{
  name = "graphormer_spatial",
  aux = {
    dist = { dtype = "int32", shape = {"b", "sq", "skv"}, fill = fill_dist },
    bias = { dtype = "float32", shape = {"hq", MAX_DIST + 1}, fill = kpt.range(-1, 1) },
  },
  score = function(s, b, h, q, k, p)
    local d = kpt.clamp(p.dist[b][q][k], 0, MAX_DIST)
    return s + p.bias[h][d]
  end,
}
