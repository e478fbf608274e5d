-- Schema 2. Whose turn it is to send one breaker's health probe: one replica
-- probes for all, and the others learn what it found through the state.
--
-- KEYS[1]  turn  string: the id of the replica holding the turn, expiring
--                (it shares the breaker's hash tag)
--
-- ARGV[1]  replica id
-- ARGV[2]  how long the turn is held unless its holder renews it (ms)
-- ARGV[3]  "1": the replica's own probes failed in a row; if it holds the
--          turn, it passes it on
--
-- Returns 1 when the turn is this replica's (free and taken, or renewed by
-- its holder), 0 while another replica holds it.
--
-- A holder renews the turn on each of its probes, so it keeps it for as long
-- as it probes; the others take over once it has been silent for `hold`. A
-- holder whose probes failed in a row passes the turn: the key says
-- "passed:<id>" for `hold`, and the first other replica to ask takes it (one,
-- never all); if none does, it expires and the turn is free again.
-- Replicas of an earlier release read a passed turn as held by another.
-- Anything unreadable in the key (another type, no expiry, an expiry far
-- beyond what this replica would ask for) is garbage, not a holder: it is
-- deleted, so nothing left in Redis can stop every replica from probing.

local K, me = KEYS[1], ARGV[1] or ''
local hold = math.floor(tonumber(ARGV[2]) or 0)
if hold ~= hold or hold < 1 then
  hold = 1
elseif hold > 1e10 then
  hold = 1e10
end

local kind = redis.call('TYPE', K)
if type(kind) == 'table' then
  kind = kind.ok
end
if kind ~= 'none' then
  local left = redis.call('PTTL', K)
  if kind ~= 'string' or left < 0 or left > 10 * hold then
    redis.call('DEL', K)
  end
end

local holder = redis.call('GET', K)
local passed = 'passed:' .. me
if holder == me and ARGV[3] == '1' then
  redis.call('SET', K, passed, 'PX', string.format('%d', hold))
  return 0
end
if holder == false or holder == me
    or (holder ~= passed and string.sub(holder, 1, 7) == 'passed:') then
  redis.call('SET', K, me, 'PX', string.format('%d', hold))
  return 1
end
return 0
