-- Graphormer edge encoding: each pair of nodes gets a bias from its edge features, weighted per
-- head.
--
-- Graphormer adds to the score of nodes i and j the mean, over the edges of their shortest path,
-- of each edge's features dotted with a learned weight vector. Here the path's features are
-- aggregated per pair beforehand (as a data loader does once per graph), so each pair carries K
-- features: a [B, N, N, K] tensor, read as edge[b][q][k][c]. The bias is
-- (1/K) * sum over c of edge[b][q][k][c] * w[h][c]; w and edge both get gradients.
--
-- Source: Ying et al., "Do Transformers Really Perform Bad for Graph Representation?"
-- (NeurIPS 2021), §3.1.3, "Edge Encoding in the Attention".
--
-- Aux tensors:  edge[b][i][j][c]  float32 per-pair edge features, [B, N, N, K]
--               w[h][c]           float32 per-head weights, [heads, K]

local K = 4

return kpt.pattern{
  name = "graphormer_edges",
  aux = {
    edge = { dtype = "float32", shape = {"b", "sq", "skv", K}, fill = kpt.range(-1, 1) },
    w = { dtype = "float32", shape = {"hq", K}, fill = kpt.range(-1, 1) },
  },
  score = function(s, b, h, q, k, p)
    local bias = 0
    for c = 0, K - 1 do
      bias = bias + p.edge[b][q][k][c] * p.w[h][c]
    end
    return s + bias / K
  end,
}
