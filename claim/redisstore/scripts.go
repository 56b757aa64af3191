package redisstore

import (
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// newScript is the script src with the record's fields rendered
// (claim.LuaLayout): the scripts name the fields they read, and the
// offsets come from the codec's one declaration.
func newScript(src string) *redis.Script { return redis.NewScript(claim.LuaLayout(src)) }

// The scripts compare-then-act atomically on one key, so each is safe on a
// Cluster and under go-redis' automatic retries. They read the fixed header
// of a stored value (claim.Fields: the version, the state, the owner
// token, ...), named by placeholders ({{rec.token}}) that newScript
// renders. A value with another version is never overwritten or deleted.

// claimScript is the claim: it sets the key if absent, or returns the
// current value, and in both cases the key's PTTL and Redis' clock, read
// in the same atomic step. So the owner of a new claim learns, from its
// own round trip, when its SET ran on Redis' clock, exactly as any later
// reader will compute it (mark.go), and a claim that finds another
// attempt in progress has its Retry-After and never-forwarded check
// without a second round trip.
//
// A settled record (a replay: its state byte is not in progress) needs
// neither, and is returned alone: Redis runs two commands less for every
// replay. A streamed record longer than the caller reads (planted or
// edited: no owner stores that much) is not returned at all, only its
// length.
//
// KEYS[1] key; ARGV[1] encoded in-progress record; ARGV[2] lease ms;
// ARGV[3] the longest streamed record returned (0 or absent: any).
// Returns {1, pttl, TIME's seconds, TIME's microseconds} when claimed,
// {value, pttl, seconds, microseconds} for a record in progress,
// {0, length} for a streamed record longer than ARGV[3], or {value} for
// any other.
var claimScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  cur = 1
elseif string.byte(cur, {{rec.state}}) ~= 1 then
  local limit = tonumber(ARGV[3]) or 0
  if limit > 0 and string.byte(cur, {{rec.state}}) == 3 and #cur > limit then return {0, #cur} end
  return {cur}
end
local t = redis.call('TIME')
return {cur, redis.call('PTTL', KEYS[1]), t[1], t[2]}
`)

// ttlScript reads a key's PTTL and Redis' clock at once, so that when the
// key's TTL was set is known on Redis' clock whatever the reply's delay
// (mark.go).
//
// KEYS[1] key. Returns {pttl, TIME's seconds, TIME's microseconds}.
var ttlScript = newScript(`
local t = redis.call('TIME')
return {redis.call('PTTL', KEYS[1]), t[1], t[2]}
`)

// renewScript extends the lease, only while we still own the key and it is
// in progress. A record whose TTL was set by its claim (mark.go: the top
// bits of byte 68 are 01) is rewritten as renewed (10), so that nobody
// takes the TTL for the claim's any more.
//
// KEYS[1] key; ARGV[1] token; ARGV[2] lease ms.
// Returns 1 renewed, 0 gone, -1 owned by someone else, -2 already completed.
var renewScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] then return -1 end
if string.byte(cur, {{rec.state}}) ~= 1 then return -2 end
local m = string.byte(cur, {{rec.mark}}) or 0
if m >= 64 and m < 128 then
  redis.call('SET', KEYS[1], string.sub(cur, {{rec.version.at}}, {{rec.completed.last}}) .. string.char(m + 64) .. string.sub(cur, {{rec.statusLow.at}}), 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
`)

// releaseUnforwardedScript deletes a claim its owner never forwarded
// (mark.go), fenced on its token, its state and its status slot: a claim
// renewed or settled since is left alone.
//
// KEYS[1] key; ARGV[1] token; ARGV[2] the status slot seen (2 bytes);
// ARGV[3] the publish command.
// Returns 1 released, 0 gone, -1 changed.
var releaseUnforwardedScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] or string.byte(cur, {{rec.state}}) ~= 1 or string.sub(cur, {{rec.status}}) ~= ARGV[2] then return -1 end
redis.call('DEL', KEYS[1])
redis.pcall(ARGV[3], KEYS[1], '')
return 1
`)

// completeScript stores the settled record, fenced by the owner token. When
// the key has lapsed and nobody claimed it since, the record is still
// written: no other attempt can be running, and a stored outcome turns a
// later retry into a replay instead of a second execution.
//
// KEYS[1] key; ARGV[1] token; ARGV[2] encoded completed record; ARGV[3]
// retention ms; ARGV[4] the publish command (see watch.go).
// Returns 1 stored, 2 stored after the lease lapsed, 3 already stored by us
// (a resent command), -1 owned by someone else.
var completeScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.pcall(ARGV[4], KEYS[1], '')
  return 2
end
if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] then return -1 end
if string.byte(cur, {{rec.state}}) == 2 then return 3 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.pcall(ARGV[4], KEYS[1], '')
return 1
`)

// releaseScript deletes the key, only while we own it and it is in
// progress.
//
// KEYS[1] key; ARGV[1] token; ARGV[2] the publish command.
// Returns 1 released, 0 already gone, -1 owned by someone else, -2 completed.
var releaseScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] then return -1 end
if string.byte(cur, {{rec.state}}) ~= 1 then return -2 end
redis.call('DEL', KEYS[1])
redis.pcall(ARGV[2], KEYS[1], '')
return 1
`)

// orphanScript settles an orphaned in-progress record, one whose owner
// stopped renewing: its key's TTL (lease + tail) has fallen to the tail.
// The record is replaced by the caller's completed one, fenced on the
// orphan's token, on the lease still being over, and on the key's expiry
// being the one the caller judged the owner gone by (a renewal moves it).
//
// KEYS[1] key; ARGV[1] orphan's token; ARGV[2] encoded completed record;
// ARGV[3] retention ms; ARGV[4] the orphan's tail ms; ARGV[5] the publish
// command; ARGV[6] the orphan's expiry as the caller read it (Unix ms on
// Redis' clock; 0: not fenced on it); ARGV[7] how far a reading of it may
// be off (ms).
// Returns 1 settled, 0 gone, -1 owned by someone else, -2 completed, -3
// the owner renewed its lease.
var orphanScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] then return -1 end
if string.byte(cur, {{rec.state}}) ~= 1 then return -2 end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > tonumber(ARGV[4]) then return -3 end
local exp = tonumber(ARGV[6])
if exp > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if math.abs(now + pttl - exp) > tonumber(ARGV[7]) then return -3 end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.pcall(ARGV[5], KEYS[1], '')
return 1
`)

var scripts = []*redis.Script{claimScript, ttlScript, epochScript, epochLostScript, renewScript, completeScript, releaseScript, orphanScript, forgetScript, releaseUnforwardedScript, takeOverScript, freeAbsentScript, streamStartScript, streamAppendScript, streamEndScript, streamReadScript}

// takeOverScript replaces a record whose outcome is unknown with the
// caller's in-progress claim, so that it alone asks the upstream
// (reconcile.go): an orphan (fenced on its token, on its lease being over
// and on its key's expiry being the one the caller judged the owner gone
// by: a renewal since moves it) or a completed record (fenced on its
// token). A streamed record (state 3) is never taken over, whatever it
// carries. It returns since, a time on Redis' clock no earlier than the
// first attempt's last sign of life, from which an "absent" answer is
// judged: for an orphan, when its TTL would have been its tail alone (its
// last renewal, or claim, came no later); for a completed record, the
// caller's since (the first attempt's claim, as its owner measured it on
// Redis' clock), or now when it has none.
//
// KEYS[1] key; ARGV[1] the old record's token; ARGV[2] the new encoded
// in-progress record; ARGV[3] its TTL ms; ARGV[4] the orphan's tail ms;
// ARGV[5] the completed record's since (Unix ms on Redis' clock; 0: none);
// ARGV[6] the orphan's expiry as the caller read it (Unix ms on Redis'
// clock; 0: not fenced on it); ARGV[7] how far a reading of it may be off
// (ms).
// Returns {1, since ms, now ms} taken over, {0} gone, {-1} changed, {-3}
// the orphan's owner renewed its lease.
var takeOverScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return {0} end
local state = string.byte(cur, {{rec.state}})
if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] or (state ~= 1 and state ~= 2) then return {-1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since
if state == 1 then
  local pttl = redis.call('PTTL', KEYS[1])
  local tail = tonumber(ARGV[4])
  if pttl > tail then return {-3} end
  local exp = tonumber(ARGV[6])
  if exp > 0 and math.abs(now + pttl - exp) > tonumber(ARGV[7]) then return {-3} end
  since = now - (tail - pttl)
else
  since = tonumber(ARGV[5])
  if since <= 0 or since > now then since = now end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {1, since, now}
`)

// freeAbsentScript frees a key the caller took over to reconcile, once
// the upstream said it never acted: fenced on the caller's token and its
// claim still in progress, and only when at least ARGV[3] ms have passed
// since ARGV[2] on Redis' clock, read here, and Redis' clock and the
// caller's (ARGV[5], read as it sent the command) differ by no more than
// ARGV[6] ms: one stepped clock alone never frees a key.
//
// KEYS[1] key; ARGV[1] token; ARGV[2] since (Unix ms, Redis' clock);
// ARGV[3] the age an absent answer needs (ms); ARGV[4] the publish
// command; ARGV[5] the caller's clock (Unix ms); ARGV[6] the largest
// offset allowed between the clocks (ms).
// Returns {1} freed, {0} gone, {-1} changed, {-4, ms still to wait}, {-6,
// the offset ms} the clocks disagree.
var freeAbsentScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return {0} end
if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] or string.byte(cur, {{rec.state}}) ~= 1 then return {-1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local skew = now - tonumber(ARGV[5])
if math.abs(skew) > tonumber(ARGV[6]) then return {-6, skew} end
local left = tonumber(ARGV[2]) + tonumber(ARGV[3]) - now
if left > 0 then return {-4, left} end
redis.call('DEL', KEYS[1])
redis.pcall(ARGV[4], KEYS[1], '')
return {1}
`)

// forgetScript deletes the key only while its record is in the given state,
// so that an operator clearing a stuck claim never deletes an answer that
// was stored a moment before, nor the reverse.
//
// KEYS[1] key; ARGV[1] state byte (1 in progress, 2 completed); ARGV[2]
// the publish command.
// Returns 1 deleted, 0 gone, -1 in another state or not a record of ours.
var forgetScript = newScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if string.byte(cur, {{rec.version}}) ~= 1 or string.byte(cur, {{rec.state}}) ~= tonumber(ARGV[1]) then return -1 end
redis.call('DEL', KEYS[1])
redis.pcall(ARGV[2], KEYS[1], '')
return 1
`)

// epochScript returns the master's epoch marker, creating it when it is
// missing, marked ":lost" when the caller says the previous one was seen.
// A new marker holds the later of Redis' clock and the caller's (read as
// it sent the command): a loss happened before the marker was made, and
// requests first sent before it are refused, so a Redis clock that is
// behind must not move the epoch's start back over requests that had
// executed before the loss (it let them execute again).
//
// KEYS[1] the marker; ARGV[1] "lost" or "new"; ARGV[2] the caller's clock,
// microseconds since the Unix epoch. Returns {created (0/1), its value:
// microseconds, then ":lost" for an epoch after a loss}.
var epochScript = newScript(`
local v = redis.call('GET', KEYS[1])
if v then return {0, v} end
local t = redis.call('TIME')
v = t[1] .. string.format('%06d', tonumber(t[2]))
local caller = tonumber(ARGV[2])
if caller and caller > tonumber(t[1]) * 1000000 + tonumber(t[2]) then v = ARGV[2] end
if ARGV[1] == 'lost' then v = v .. ':lost' end
redis.call('SET', KEYS[1], v, 'NX')
return {1, redis.call('GET', KEYS[1])}
`)

// epochLostScript marks an epoch marker as following a loss, if it is
// still the one the caller read.
//
// KEYS[1] the marker; ARGV[1] its value as read (without ":lost").
var epochLostScript = newScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1] .. ':lost')
end
return 1
`)

// The streamed-record scripts (stream.go) share two helpers: be8 writes a
// number of milliseconds as the 8 big-endian bytes of a record's time
// slot, rd8 reads one (1-based position).
const streamLua = `
local function be8(n)
  local s = ''
  for i = 1, 8 do
    s = string.char(n % 256) .. s
    n = math.floor(n / 256)
  end
  return s
end
local function rd8(s, at)
  local n = 0
  for i = at, at + 7 do n = n * 256 + string.byte(s, i) end
  return n
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// streamStartScript replaces the owner's in-progress claim with the head
// of its streamed answer, its lease (from now on Redis' clock) in the
// completed slot, kept for retention. As completeScript, a key that
// lapsed with nobody claiming it since is written anyway.
//
// KEYS[1] key; ARGV[1] token; ARGV[2] the head; ARGV[3] retention ms;
// ARGV[4] lease ms; ARGV[5] the publish command.
// Returns 1 started, 2 started after the lease lapsed, 3 already started
// by us (resent), -1 owned by someone else, -2 completed.
var streamStartScript = newScript(streamLua + `
local cur = redis.call('GETRANGE', KEYS[1], {{rec.version.off}}, {{rec.token.offlast}})
local how = 1
if cur == '' then
  how = 2
else
  if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] then return -1 end
  if string.byte(cur, {{rec.state}}) == 3 then return 3 end
  if string.byte(cur, {{rec.state}}) ~= 1 then return -2 end
end
local v = ARGV[2]
v = string.sub(v, {{rec.version.at}}, {{rec.created.last}}) .. be8(now + tonumber(ARGV[4])) .. string.sub(v, {{rec.status.at}})
redis.call('SET', KEYS[1], v, 'PX', ARGV[3])
redis.pcall(ARGV[5], KEYS[1], '')
return how
`)

// streamAppendScript appends a chunk to the owner's running stream, fenced
// on its token and the value's length (a resent append is a no-op), and
// renews the owner's lease: always for a renewal alone, and with a chunk
// once a sixth of the lease went by since it was last renewed (an append
// per event rewrote the lease's slot for every event; the owner renews a
// third of the lease after its last append, so at least half of the lease
// is left when it does). Once the lease ran out on Redis' clock nothing
// more is appended: the stream is marked aborted, as readers already take
// it.
//
// It runs for every streamed event, so it is written for Redis' time
// (BenchmarkStreamAppend): a number passed to redis.call is formatted
// with printf and parsed back (offsets are string literals here), a
// table returned costs more than a number (one number answers), a
// helper defined in the script is a closure made on every call, and the
// length is fenced on APPEND's answer, not read first with STRLEN (a
// command less; 7.7 -> 7.3 µs): an append that finds another length (a
// resent one whose first send landed) puts the value back as it was,
// TTL kept, copying it once on that rare path.
//
// KEYS[1] key; ARGV[1] token; ARGV[2] the length expected; ARGV[3] the
// chunk (empty: a renewal); ARGV[4] lease ms; ARGV[5] the publish command.
// Returns the new length (> 0), 0 gone, -1 not ours, -2 ended, -3 the
// lease had run out, or -16 - length: another length (appendOther).
var streamAppendScript = newScript(`
local cur = redis.call('GETRANGE', KEYS[1], '{{rec.version.off}}', '{{rec.streamHead.offlast}}')
if cur == '' then return 0 end
local v, st = string.byte(cur, {{rec.version.at}}, {{rec.state.at}})
if v ~= 1 or st ~= 3 or string.sub(cur, {{rec.token}}) ~= ARGV[1] then return -1 end
local a, b, c, d, e, f, g, h, _, _, over = string.byte(cur, {{rec.completed.at}}, {{rec.streamEnd.at}})
if over ~= 0 then return -2 end
local ends = ((((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f) * 256 + g) * 256 + h
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ends < now then
  redis.call('SETRANGE', KEYS[1], '{{rec.streamEnd.off}}', '\2')
  redis.pcall(ARGV[5], KEYS[1], '')
  return -3
end
local data = ARGV[3]
local n
if #data > 0 then
  n = redis.call('APPEND', KEYS[1], data)
  local was = n - #data
  if was ~= tonumber(ARGV[2]) then
    redis.call('SET', KEYS[1], redis.call('GETRANGE', KEYS[1], '{{rec.version.off}}', tostring(was - 1)), 'KEEPTTL')
    return -16 - was
  end
else
  n = redis.call('STRLEN', KEYS[1])
  if n ~= tonumber(ARGV[2]) then return -16 - n end
end
local lease = tonumber(ARGV[4])
if #data == 0 or ends < now + lease - lease / 6 then
  local x, s = now + lease, ''
  for i = 1, 8 do
    s = string.char(x % 256) .. s
    x = math.floor(x / 256)
  end
  redis.call('SETRANGE', KEYS[1], '{{rec.completed.off}}', s)
end
if #data > 0 then redis.pcall(ARGV[5], KEYS[1], '') end
return n
`)

// appendOther is streamAppendScript's answer for a stored value of
// another length, -appendOther - length.
const appendOther = 16

// streamEndScript records how the owner's running stream ended, and when.
// A normal end is fenced on the value's length (every chunk sent is
// there) and on the lease not having run out (readers took the stream
// for aborted then).
//
// KEYS[1] key; ARGV[1] token; ARGV[2] the end (1 ended, 2 aborted, 3 too
// large); ARGV[3] the length expected (-1: any); ARGV[4] the publish
// command; ARGV[5] appended with a normal end (a sealed stream's end
// frame), or empty.
// Returns {1} recorded (or already, the same), {0} gone, {-1} not ours,
// {-2} ended otherwise, {-5, length} another length.
var streamEndScript = newScript(streamLua + `
local cur = redis.call('GETRANGE', KEYS[1], {{rec.version.off}}, {{rec.streamHead.offlast}})
if cur == '' then return {0} end
if string.byte(cur, {{rec.version}}) ~= 1 or string.sub(cur, {{rec.token}}) ~= ARGV[1] or string.byte(cur, {{rec.state}}) ~= 3 then return {-1} end
local e = tonumber(ARGV[2])
local was = string.byte(cur, {{rec.streamEnd}})
if was ~= 0 then
  if was == e then return {1} end
  return {-2}
end
local at = tonumber(ARGV[3])
if at >= 0 then
  local n = redis.call('STRLEN', KEYS[1])
  if n ~= at then return {-5, n} end
end
if e == 1 and rd8(cur, {{rec.completed.at}}) < now then
  redis.call('SETRANGE', KEYS[1], {{rec.streamEnd.off}}, '\2')
  redis.pcall(ARGV[4], KEYS[1], '')
  return {-2}
end
if e == 1 and ARGV[5] and #ARGV[5] > 0 then redis.call('APPEND', KEYS[1], ARGV[5]) end
redis.call('SETRANGE', KEYS[1], {{rec.streamEnd.off}}, string.char(e))
redis.call('SETRANGE', KEYS[1], {{rec.completed.off}}, be8(now))
redis.pcall(ARGV[4], KEYS[1], '')
return {1}
`)

// streamReadScript reads a streamed value from an offset, with its fixed
// part and Redis' clock, so that a reader judges the owner's lease by
// Redis' clock in the same round trip.
//
// KEYS[1] key; ARGV[1] offset (0-based); ARGV[2] at most this many bytes.
// Returns {the first 74 bytes, the value's length, the bytes, now ms}.
var streamReadScript = newScript(streamLua + `
local head = redis.call('GETRANGE', KEYS[1], {{rec.version.off}}, {{rec.streamHead.offlast}})
local n = redis.call('STRLEN', KEYS[1])
local from = tonumber(ARGV[1])
local data = ''
if from < n then data = redis.call('GETRANGE', KEYS[1], from, from + tonumber(ARGV[2]) - 1) end
return {head, n, data, now}
`)
