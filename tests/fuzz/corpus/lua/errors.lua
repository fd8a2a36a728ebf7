local ok, e = pcall(function() return kpt.sq + true end)
return kpt.pattern{ mask = function(b, h, q, k) return q:lt(k) ~ (q + 1):ge(k) end }
