local t = {}
for i = 1, 1/0 do string.rep("x", i) end
pcall(error, setmetatable({}, {}))
return kpt.ptern{ score = function(s)kpt.bre("soft)c0p+3a(alibi", s) end }
