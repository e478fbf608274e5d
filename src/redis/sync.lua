-- Schema 2. One replica's exchange with the cluster state of one breaker,
-- atomically. Replicas of another schema use other keys (the `v2` below) and
-- another message format; see `mod.rs` for how they are told apart.
--
-- The arguments and the reply are named, not numbered: `script.rs` defines
-- `A` (`ARGV[A.calls]`) and `R` (`out[R.epoch]`) above this text from its
-- `Arg` and `Field` lists, the one place both ends read them from.
--
-- The script stores and sums; it judges no rate. The closed-state window is
-- summed across replicas and handed back in the reply, and each replica's
-- own rules (the Rust core's `evaluate`) judge it: a replica that sees the
-- sum cross a rule trips and sends `trip`, which opens the cluster here.
--
-- KEYS[1]  state   hash: state ("closed" | "open" | "forced" | "disabled"),
--                  until (ms), len (ms the open period was set for), reopens,
--                  epoch, ok, failed, cause ("reset" after an operator reset),
--                  gate ("1" while the open period is a quota gate)
-- KEYS[2]  window  hash: "c:<bucket>", "f:<bucket>", "s:<bucket>" counts
-- KEYS[3]  probes  sorted set: probe lease id -> lease deadline (ms)
-- KEYS[4]  votes   sorted set: replica id -> last failure or trip (ms)
-- KEYS[5]  spend   hash: "<slice>" -> what the fleet's calls cost in it, the
--                  slice numbered from the Unix epoch in A.spend_width ms
--                  (so a slice of an hour or a day is a UTC hour or day)
--
-- A.channel    channel for transition messages
-- A.name       breaker name (named in messages)
-- A.epoch      epoch the probe reports and the overdue flag below belong to
-- A.trip       1 if the replica's breaker tripped (on its own window, or on
--              the summed window a reply handed it)
-- A.calls, A.failures, A.slow   closed-state calls, failures and slow calls
--              since last time
-- A.span, A.buckets             window span (ms) and bucket count
-- A.open, A.open_max, A.multiplier, A.jitter
--              open (ms), open cap (ms), backoff multiplier, jitter fraction
-- A.probes, A.close_after, A.lease   probes, close_after, probe lease (ms)
-- A.replica    replica id
-- A.quorum     distinct replicas whose failures must agree (1 = off)
-- A.control    operator control: "" | "force" | "disable" | "reset"
-- A.overdue    1 if the replica's own clock says the open period is over
-- A.claim      probe lease id to claim ("" = none)
-- A.heal       1 if a health probe of the replica found the upstream
--              answering in the open period of A.epoch
-- A.gate       with A.trip: the trip is a quota gate, open this long (ms;
--              0 = an ordinary trip)
-- A.spend      what the replica's spend guard charged since last time
-- A.spend_width, A.spend_slices   the guard's slice (ms; 0 = no guard) and
--              the slices its period spans
-- after them   pairs: probe lease id, "s" (succeeded) | "f" (failed) |
--              "r" (released unused)
--
-- Returns R.code (0 closed, 1 open, 2 half-open, 3 forced open,
-- 4 disabled), R.remaining (ms until half-open), R.epoch, R.granted (1 if
-- the claim was granted), R.reset (1 if the state is an operator's reset),
-- R.gated (1 if the open period is a quota gate), and R.calls, R.failures,
-- R.slow: the summed window when this exchange added calls to it, else -1;
-- R.spent: the fleet's spend of the period with A.spend added (-1 without a
-- guard), R.spend_left (ms left in the current slice), and after the named
-- fields the period's A.spend_slices slices, oldest first.
--
-- The spend is summed, never judged, as the window: each replica's guard
-- compares the sum with its budget. It lives in its own key, which no
-- transition clears; replicas of an earlier release of this schema send no
-- spend and read none (their guards count their own calls only).
--
-- Time comes from this server's clock, and is trusted only within bounds: a
-- deadline further out than the period it was set for means the clock went
-- back, and the period ends now; a replica whose own clock says a period
-- outlasted the open cap ends it too (A.overdue). Anything unreadable in the
-- keys (wrong type, non-numeric field, unknown state, a deadline past the
-- year 2286) is treated as absent and overwritten on the next write, never
-- raised as an error.
--
-- A health probe's heal (A.heal) ends the open period now, as a new epoch
-- that is published, so every replica turns half-open at once and real
-- traffic confirms; it keeps the reopen count (the backoff) and the window.
-- Replicas of an earlier release of this schema send no heal, and read the
-- healed state as any open period that is over.
--
-- A quota gate (A.gate) opens the cluster for its reset, not for the open
-- duration: no backoff, no jitter, no open cap and no quorum (an exhausted
-- account is a fact, not one replica's view of the upstream), and it leaves
-- the reopen count alone. Replicas of an earlier release of this schema
-- send none, and read a gate as an ordinary open period (which their own
-- open cap may end early).

local S, W, P, V, K = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local function num(v)
  local n = tonumber(v)
  if n == nil or n ~= n or n > 1e17 or n < -1e17 then
    return nil
  end
  return n
end

local function int(v, lo, hi, default)
  local n = num(v)
  if n == nil then
    return default
  end
  n = math.floor(n)
  if n < lo then
    return lo
  end
  if n > hi then
    return hi
  end
  return n
end

local function kind(key)
  local t = redis.call('TYPE', key)
  if type(t) == 'table' then
    return t.ok
  end
  return t
end

-- Integers go to Redis as decimal strings: never in exponent notation.
local function str(n)
  return string.format('%d', n)
end

local function own(key, want)
  local k = kind(key)
  if k ~= 'none' and k ~= want then
    redis.call('DEL', key)
  end
end

local channel, name = ARGV[A.channel], ARGV[A.name]
local known = ARGV[A.epoch]
local trip = ARGV[A.trip] == '1'
local dc = int(ARGV[A.calls], 0, 1e12, 0)
local df = int(ARGV[A.failures], 0, dc, 0)
local ds = int(ARGV[A.slow], 0, dc, 0)
local span = int(ARGV[A.span], 1, 1e10, 10000)
local buckets = int(ARGV[A.buckets], 1, 1000, 10)
local open_ms = int(ARGV[A.open], 1, 1e10, 30000)
local open_max = int(ARGV[A.open_max], open_ms, 1e10, open_ms)
local mult = num(ARGV[A.multiplier]) or 1
if mult < 1 or mult > 1e6 then
  mult = 1
end
local jitter = num(ARGV[A.jitter]) or 0
if jitter < 0 or jitter >= 1 then
  jitter = 0
end
local probes = int(ARGV[A.probes], 1, 1e6, 1)
local close_after = int(ARGV[A.close_after], 1, probes, 1)
local lease = int(ARGV[A.lease], 1, 1e10, open_ms)
local replica = ARGV[A.replica] or ''
local quorum = int(ARGV[A.quorum], 1, 1e6, 1)
local control = ARGV[A.control] or ''
local overdue = ARGV[A.overdue] == '1'
local claim = ARGV[A.claim] or ''
local heal = ARGV[A.heal] == '1'
local gate = int(ARGV[A.gate], 0, 1e10, 0)
-- Amounts stay below 2^53, where a Lua number still counts them exactly.
local spend = int(ARGV[A.spend], 0, 1e15, 0)
local spend_width = int(ARGV[A.spend_width], 0, 1e10, 0)
local spend_n = int(ARGV[A.spend_slices], 1, 1000, 1)
local FIRST_REPORT = A.spend_slices + 1

local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(usec / 1000)
local now_us = sec * 1000000 + usec

own(S, 'hash')
own(W, 'hash')
own(P, 'zset')
own(V, 'zset')

-- === read the state ===

local f = redis.call('HMGET', S, 'state', 'until', 'reopens', 'epoch', 'ok', 'failed',
  'len', 'cause', 'gate')
local state, untl, reopens = 'closed', 0, 0
local gated = false
local epoch = int(f[4], 0, 1e17, 0)
local ok, failed = 0, 0
local cause = ''
if f[1] == 'open' then
  local u = num(f[2])
  if u ~= nil and u > 0 and u <= 1e13 then
    state, untl = 'open', math.floor(u)
    reopens = int(f[3], 0, 1000, 0)
    ok = int(f[5], 0, probes, 0)
    failed = int(f[6], 0, probes, 0)
    gated = f[9] == '1'
    local len = int(f[7], 1, 1e10, open_max)
    -- Further out than the period was set for: this clock went back. The
    -- period ends now rather than outlast its length by the step.
    if untl - now > len + 1000 then
      untl = now
      redis.call('HSET', S, 'until', str(untl))
    end
  end
elseif f[1] == 'forced' or f[1] == 'disabled' then
  state = f[1]
elseif f[1] == 'closed' and f[8] == 'reset' then
  cause = 'reset'
end
local changed = false

local function set_open(reopen)
  if reopen then
    reopens = math.min(reopens + 1, 1000)
  else
    reopens = 0
  end
  local d = math.min(open_ms * mult ^ math.min(reopens, 64), open_max)
  d = math.max(math.floor(d * (1 - jitter)), 1)
  state, untl, ok, failed = 'open', now + d, 0, 0
  epoch = math.max(epoch + 1, now_us)
  cause, gated = '', false
  redis.call('DEL', W, P, V)
  redis.call('HSET', S, 'state', 'open', 'until', str(untl), 'len', str(d),
    'reopens', str(reopens), 'epoch', str(epoch), 'ok', '0', 'failed', '0', 'cause', '',
    'gate', '0')
  redis.call('PEXPIRE', S, str(d + 2 * lease + 86400000))
  changed = true
end

-- The account's quota ran out: open until its reset, the backoff untouched.
local function set_gate(d)
  state, untl, ok, failed = 'open', now + d, 0, 0
  epoch = math.max(epoch + 1, now_us)
  cause, gated = '', true
  redis.call('DEL', W, P, V)
  redis.call('HSET', S, 'state', 'open', 'until', str(untl), 'len', str(d),
    'reopens', str(reopens), 'epoch', str(epoch), 'ok', '0', 'failed', '0', 'cause', '',
    'gate', '1')
  redis.call('PEXPIRE', S, str(d + 2 * lease + 86400000))
  changed = true
end

local function set_closed(why)
  state, untl, reopens, ok, failed, cause = 'closed', 0, 0, 0, 0, why
  epoch = math.max(epoch + 1, now_us)
  gated = false
  redis.call('DEL', W, P, V)
  redis.call('HSET', S, 'state', 'closed', 'until', '0', 'len', '0', 'reopens', '0',
    'epoch', str(epoch), 'ok', '0', 'failed', '0', 'cause', why, 'gate', '0')
  redis.call('PEXPIRE', S, '86400000')
  changed = true
end

-- An operator's state holds until an operator changes it: no expiry.
local function set_control(to)
  state, untl, reopens, ok, failed, cause = to, 0, 0, 0, 0, ''
  epoch = math.max(epoch + 1, now_us)
  gated = false
  redis.call('DEL', W, P, V)
  redis.call('HSET', S, 'state', to, 'until', '0', 'len', '0', 'reopens', '0',
    'epoch', str(epoch), 'ok', '0', 'failed', '0', 'cause', '', 'gate', '0')
  redis.call('PERSIST', S)
  changed = true
end

-- Whether failures came from enough distinct replicas to open the circuit;
-- records this replica's vote first when it brings failures.
local function quorate(voting)
  if quorum <= 1 then
    return true
  end
  if voting and replica ~= '' then
    redis.call('ZADD', V, str(now), replica)
    redis.call('PEXPIRE', V, str(2 * span))
  end
  redis.call('ZREMRANGEBYSCORE', V, '-inf', '(' .. str(now - span))
  -- Votes from ahead of this clock (it went back) last one span at most.
  redis.call('ZREMRANGEBYSCORE', V, '(' .. str(now + span), '+inf')
  return redis.call('ZCARD', V) >= quorum
end

-- === an operator's control ===

if control == 'force' then
  set_control('forced')
elseif control == 'disable' then
  set_control('disabled')
elseif control == 'reset' then
  set_closed('reset')
end

-- === a replica's clock says the period is over ===

if overdue and state == 'open' and now < untl and num(known) == epoch then
  untl = now
  redis.call('HSET', S, 'until', str(untl))
end

-- === a replica's health probe found the upstream answering ===

if heal and state == 'open' and now < untl and num(known) == epoch then
  untl = now
  epoch = math.max(epoch + 1, now_us)
  redis.call('DEL', P)
  redis.call('HSET', S, 'until', str(untl), 'epoch', str(epoch), 'ok', '0', 'failed', '0')
  ok, failed = 0, 0
  changed = true
end

local half_open = state == 'open' and now >= untl

-- === probe outcomes ===

if #ARGV >= FIRST_REPORT and half_open and num(known) == epoch then
  local counted = false
  for i = FIRST_REPORT, #ARGV - 1, 2 do
    local id, code = ARGV[i], ARGV[i + 1]
    -- A lease that expired was taken back: its late outcome is dropped.
    if redis.call('ZREM', P, id) == 1 then
      if code == 's' then
        ok = ok + 1
        counted = true
      elseif code == 'f' then
        failed = failed + 1
        counted = true
      end
    end
  end
  if ok >= close_after then
    set_closed('probes')
  elseif probes - math.min(failed, probes) < close_after then
    set_open(true)
  elseif counted then
    redis.call('HSET', S, 'ok', str(ok), 'failed', str(failed))
  end
end

-- === a replica's own trip ===

if state == 'closed' and (trip or df > 0) and quorum > 1 then
  -- A vote is cast whether or not the window below trips on this call.
  quorate(true)
end
if state == 'closed' and trip and gate > 0 then
  set_gate(gate)
elseif state == 'closed' and trip and quorate(false) then
  set_open(false)
end

-- === the cluster window ===

-- Summed, never judged: the replicas' own rules judge the sum.
local w_calls, w_fails, w_slows = -1, -1, -1
if state == 'closed' and dc > 0 then
  local width = math.max(math.floor(span / buckets), 1)
  local cur = math.floor(now / width)
  local oldest = cur - buckets + 1
  if redis.call('HLEN', W) > 3 * buckets + 32 then
    redis.call('DEL', W)
  end
  local calls, fails, slows = dc, df, ds
  local stale = {}
  local all = redis.call('HGETALL', W)
  for i = 1, #all - 1, 2 do
    local field, value = all[i], all[i + 1]
    local what, idx = string.match(field, '^([cfs]):(%d+)$')
    local b = num(idx)
    local v = num(value)
    if what == nil or b == nil or b < oldest or b > cur
        or v == nil or v < 0 or v > 1e12 or v ~= math.floor(v) then
      stale[#stale + 1] = field
    elseif what == 'c' then
      calls = calls + v
    elseif what == 'f' then
      fails = fails + v
    else
      slows = slows + v
    end
  end
  if #stale > 0 then
    redis.call('HDEL', W, unpack(stale))
  end
  local suffix = ':' .. str(cur)
  redis.call('HINCRBY', W, 'c' .. suffix, str(dc))
  if df > 0 then
    redis.call('HINCRBY', W, 'f' .. suffix, str(df))
  end
  if ds > 0 then
    redis.call('HINCRBY', W, 's' .. suffix, str(ds))
  end
  redis.call('PEXPIRE', W, str(span + width))
  -- Counts written by hand could break the shape: the reply never carries
  -- more failures or slow calls than calls.
  w_calls, w_fails, w_slows = calls, math.min(fails, calls), math.min(slows, calls)
end

-- === claiming a probe slot ===

local granted = 0
half_open = state == 'open' and now >= untl
if half_open and claim ~= '' then
  redis.call('ZREMRANGEBYSCORE', P, '-inf', str(now))
  -- Nothing of ours leases beyond one lease from now.
  redis.call('ZREMRANGEBYSCORE', P, '(' .. str(now + lease), '+inf')
  if redis.call('ZCARD', P) + ok + failed < probes then
    redis.call('ZADD', P, str(now + lease), claim)
    redis.call('PEXPIRE', P, str(2 * lease))
    granted = 1
  end
end

-- === the fleet's spend ===

-- Summed, never judged: the replicas' guards judge the sum.
local spent, spend_left = -1, 0
local spend_slices = {}
if spend_width > 0 and K ~= nil then
  own(K, 'hash')
  local cur = math.floor(now / spend_width)
  local oldest = cur - spend_n + 1
  local have = {}
  local stale = {}
  local all = redis.call('HGETALL', K)
  for i = 1, #all - 1, 2 do
    local b, v = num(all[i]), num(all[i + 1])
    if b == nil or b ~= math.floor(b) or b < oldest or b > cur
        or v == nil or v < 0 or v > 1e15 or v ~= math.floor(v) then
      stale[#stale + 1] = all[i]
    else
      local at = b - oldest + 1
      have[at] = (have[at] or 0) + v
    end
  end
  if #stale > 0 then
    redis.call('HDEL', K, unpack(stale))
  end
  if spend > 0 then
    local field = str(cur)
    local v = num(redis.call('HGET', K, field)) or 0
    redis.call('HSET', K, field, str(math.min(v + spend, 1e15)))
    have[spend_n] = math.min((have[spend_n] or 0) + spend, 1e15)
  end
  redis.call('PEXPIRE', K, str((spend_n + 1) * spend_width))
  spent = 0
  for i = 1, spend_n do
    spend_slices[i] = have[i] or 0
    spent = spent + spend_slices[i]
  end
  spend_left = math.max((cur + 1) * spend_width - now, 1)
end

local code, remaining = 0, 0
if state == 'open' then
  if now >= untl then
    code = 2
  else
    code, remaining = 1, untl - now
  end
elseif state == 'forced' then
  code = 3
elseif state == 'disabled' then
  code = 4
end
local was_reset = 0
if state == 'closed' and cause == 'reset' then
  was_reset = 1
end
local was_gated = 0
if state == 'open' and gated then
  was_gated = 1
end
-- The message carries the new state, so replicas that know the breaker
-- apply it without an exchange: `v2 <state>/<ms left>/<flags> <epoch>
-- <name>`, flags `r` (an operator's reset), `g` (a quota gate) or `-`.
-- Replicas of an earlier release read the first word as a state they do
-- not know, and re-read the breaker's state, as for any message.
if changed then
  local flags = ''
  if was_reset == 1 then
    flags = flags .. 'r'
  end
  if was_gated == 1 then
    flags = flags .. 'g'
  end
  if flags == '' then
    flags = '-'
  end
  redis.call('PUBLISH', channel, 'v2 ' .. state .. '/' .. str(remaining) .. '/' .. flags
    .. ' ' .. str(epoch) .. ' ' .. name)
end

local out = {}
out[R.code] = code
out[R.remaining] = remaining
out[R.epoch] = epoch
out[R.granted] = granted
out[R.reset] = was_reset
out[R.gated] = was_gated
out[R.calls] = w_calls
out[R.failures] = w_fails
out[R.slow] = w_slows
out[R.spent] = spent
out[R.spend_left] = spend_left
for i = 1, #spend_slices do
  out[R_LEN + i] = spend_slices[i]
end
return out
