-- A replica says it is alive, and learns who else is.
--
-- KEYS[1]  replicas hash: replica id -> "<schema> <ms>" (this format is the
--          one every schema shares, so replicas of any version find each
--          other here)
--
-- ARGV[1]  replica id
-- ARGV[2]  this replica's schema
-- ARGV[3]  how long a replica counts as alive after its last heartbeat (ms)
--
-- Returns { live replicas of this schema (this one included), then each
--           other schema seen among live replicas, once }.

local K = KEYS[1]
local id, schema = ARGV[1], ARGV[2]
local ttl = tonumber(ARGV[3]) or 10000
if ttl < 1 then
  ttl = 1
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local kind = redis.call('TYPE', K)
if type(kind) == 'table' then
  kind = kind.ok
end
if kind ~= 'none' and kind ~= 'hash' then
  redis.call('DEL', K)
end

redis.call('HSET', K, id, schema .. ' ' .. string.format('%d', now))
redis.call('PEXPIRE', K, string.format('%d', 10 * ttl))

local live, others, seen, stale, ahead = 0, {}, {}, {}, {}
local all = redis.call('HGETALL', K)
for i = 1, #all - 1, 2 do
  local s, ms = string.match(all[i + 1], '^(%d+) (%d+)$')
  local at = tonumber(ms)
  if s ~= nil and at ~= nil and at > now then
    -- Written before this clock went back: it counts from now, so a replica
    -- that died meanwhile counts as alive for one ttl, not for the step.
    ahead[#ahead + 1] = all[i]
    ahead[#ahead + 1] = s .. ' ' .. string.format('%d', now)
    at = now
  end
  if s == nil or at == nil or now - at > ttl then
    stale[#stale + 1] = all[i]
  elseif s == schema then
    live = live + 1
  elseif not seen[s] then
    seen[s] = true
    others[#others + 1] = s
  end
end
if #stale > 0 then
  redis.call('HDEL', K, unpack(stale))
end
if #ahead > 0 then
  redis.call('HSET', K, unpack(ahead))
end

local out = { live }
for _, s in ipairs(others) do
  out[#out + 1] = tonumber(s)
end
return out
