-- T5 relative-position buckets: a learned bias per head and distance bucket.
--
-- The signed distance k - q falls into one of `buckets` buckets (half for each direction):
-- distances below buckets/4 get a bucket each, larger ones share log-spaced buckets up to
-- `max_distance`, beyond which all share the last. The score gets bias[h][bucket].
--
-- Source: Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
-- Transformer" (JMLR 2020), §2.1, and the bucket function of its reference implementation.
--
-- The log-spaced bucket edges are computed here, in plain Lua, when the script runs: the kernel
-- only compares the distance with integer constants, so the buckets are exact in every backend.
--
-- Aux tensor:  bias[h][bucket]  float32, [heads, buckets]

local BUCKETS, MAX_DISTANCE = 32, 128

-- T5's bucket of a distance n >= 0 within one direction (nb buckets).
local function large_bucket(n, nb)
  local exact = nb // 2
  local v = exact + math.floor(math.log(n / exact) / math.log(MAX_DISTANCE / exact)
                               * (nb - exact) + 1e-9)
  return math.min(v, nb - 1)
end

return kpt.pattern{
  name = "t5_buckets",
  aux = {
    bias = { dtype = "float32", shape = {"hq", BUCKETS}, fill = kpt.range(-2, 2) },
  },
  score = function(s, b, h, q, k, p)
    local nb = BUCKETS // 2 -- buckets per direction
    local exact = nb // 2   -- distances below this have a bucket each
    local rel = k - q
    local n = kpt.abs(rel)
    -- beyond `exact`: count the log-spaced bucket edges at or below n
    local large, edge = exact, exact
    for v = exact + 1, nb - 1 do
      while large_bucket(edge, nb) < v do edge = edge + 1 end
      large = large + kpt.int(n:ge(edge))
    end
    local bucket = kpt.where(n:lt(exact), n, large)
    return s + p.bias[h][kpt.where(rel:gt(0), bucket + nb, bucket)]
  end,
}
