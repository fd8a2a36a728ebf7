local t = {}
for i = 1, 100 do t[i] = string.rep("x", i) end
pcall(error, setmetatable({}, {__tostring = function() return "x" end}))
return kpt.pattern{ score = function(s) return kpt.builtin_score("softcap(30)+alibi", s) end }
