-- The in-store merge of one step's update frames, run inside Redis (EVALSHA); sync/exchanges/instore.py has the design.
--
-- KEYS[1]: the step's merged record; KEYS[2..]: the senders' contributions, in the order of the ranks in ARGV.
-- ARGV: step, parameter count N, ttl (seconds), the step key xor ipad and xor opad (64 bytes each: HMAC-SHA1 as
-- RFC 2104 builds it, from redis.sha1hex), the bytes of the transport's seal, the senders as text ("0,1,2"), then
-- each sender's rank.
--
-- A contribution is an Update frame (protocol/framing.py, protocol/index_runs.py), its in-store MAC (20 bytes) and the
-- transport's seal (protocol/sealing.py's SEAL_BYTES, not checked here: Redis has no Ed25519). One whose MAC does not verify under the
-- caller's step key, or that is no well-formed update of that sender and step, is left out and named in the record.
-- Returns the record "S<step>|<senders>|<rejected>|" .. MAC .. merged frame, or, while a sender's contribution is
-- missing (the store lost it), the ranks missing, and nothing is cached.
local step, size, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ikey, okey = ARGV[4], ARGV[5]
-- MAGIC, VERSION, UPDATE, SEALED, HEADER_BYTES, MAC_BYTES and MAX_MAGNITUDE are set before this text, from the
-- Python modules that define them (instore.py's SCRIPT).
local HEADER = '<c3BBBi4i8I4I4' -- magic, version, type, flags, sender, step, length, crc: protocol/framing.py's HEADER
local SEAL_BYTES = tonumber(ARGV[6])
local CHUNK = 4000 -- values per struct call: Lua 5.1's C stack holds 8000
local DENSE_ENOUGH = 0.25 -- as sync/exchanges/base.py: a union this dense is scanned, not sorted

local prefix = 'S' .. ARGV[1] .. '|' .. ARGV[7] .. '|'
local cached = redis.call('GET', KEYS[1])
if cached and cached:sub(1, #prefix) == prefix then
    return cached
end

local function unhex(h)
    return (h:gsub('..', function(c) return string.char(tonumber(c, 16)) end))
end

local function mac(text)
    return unhex(redis.sha1hex(okey .. unhex(redis.sha1hex(ikey .. text))))
end

local formats = {}
local function format(code, m)
    local key = code .. m
    if not formats[key] then
        formats[key] = '<' .. string.rep(code, m)
    end
    return formats[key]
end

-- n values of struct `code` from position pos of s into out; the position after them
local function unpack_many(code, s, pos, n, out)
    local k = 0
    while k < n do
        local m = math.min(CHUNK, n - k)
        local got = { struct.unpack(format(code, m), s, pos) }
        pos = got[m + 1]
        for j = 1, m do
            out[k + j] = got[j]
        end
        k = k + m
    end
    return pos
end

local function pack_many(code, values, parts)
    for k = 1, #values, CHUNK do
        local m = math.min(CHUNK, #values - k + 1)
        parts[#parts + 1] = struct.pack(format(code, m), unpack(values, k, k + m - 1))
    end
end

-- Whether the indices idx[1..n] are distinct: at once when they increase, as protocol/index_runs.py's runs and a sorted
-- update's do, through a set otherwise.
local function distinct(idx, n)
    local rising = true
    for j = 2, n do
        if idx[j] <= idx[j - 1] then
            rising = false
            break
        end
    end
    if rising then return true end
    local seen = {}
    for j = 1, n do
        if seen[idx[j]] then return false end
        seen[idx[j]] = true
    end
    return true
end

-- Whether listed indices idx[1..n] are listed as protocol/index_runs.py lists them: when they form fewer than n/2 runs they
-- must travel as runs.
local function listed_canonically(idx, n)
    if n < 3 then return true end
    local runs = 1
    for j = 2, n do
        if idx[j] - idx[j - 1] ~= 1 then runs = runs + 1 end
    end
    return 2 * runs >= n
end

-- The indices and values of `frame` if it is a well-formed update of `rank` for this step, its indices encoded as
-- protocol/index_runs.py's `read_indices` accepts them (runs only when listing would take more, each run maximal and not
-- empty); nil otherwise.
local function parse(frame, rank)
    local magic, version, ftype, flags, sender, fstep, length = struct.unpack(HEADER, frame)
    if magic ~= MAGIC or version ~= VERSION or ftype ~= UPDATE or flags ~= SEALED or sender ~= rank
        or fstep ~= step or length ~= #frame - HEADER_BYTES then
        return nil
    end
    local n, r, pos = struct.unpack('<I4I4', frame, HEADER_BYTES + 1)
    if #frame - pos + 1 ~= 4 * n + (r == 0 and 4 * n or 8 * r) then
        return nil
    end
    local idx, val = {}, {}
    if r == 0 then
        pos = unpack_many('i4', frame, pos, n, idx)
        if not listed_canonically(idx, n) then
            return nil
        end
    else
        if 2 * r >= n then
            return nil
        end
        local starts, lengths = {}, {}
        pos = unpack_many('i4', frame, pos, r, starts)
        pos = unpack_many('I4', frame, pos, r, lengths)
        local k = 0
        for j = 1, r do
            if lengths[j] < 1 or k + lengths[j] > n or (j > 1 and starts[j] == starts[j - 1] + lengths[j - 1]) then
                return nil
            end
            for x = starts[j], starts[j] + lengths[j] - 1 do
                k = k + 1
                idx[k] = x
            end
        end
        if k ~= n then
            return nil
        end
    end
    unpack_many('f', frame, pos, n, val)
    for j = 1, n do
        local x, v = idx[j], val[j]
        if x < 0 or x >= size or not (v >= -MAX_MAGNITUDE and v <= MAX_MAGNITUDE) then -- NaN fails both
            return nil
        end
    end
    if not distinct(idx, n) then
        return nil
    end
    return idx, val
end

-- Each contribution verified and parsed, in the senders' order.
local updates, rejected, missing, first = {}, {}, {}, nil
local lo, hi, total = math.huge, -1, 0
for i = 2, #KEYS do
    local rank = tonumber(ARGV[6 + i])
    local value = redis.call('GET', KEYS[i])
    local idx, val
    if not value then
        missing[#missing + 1] = rank
    elseif #value >= HEADER_BYTES + MAC_BYTES + SEAL_BYTES then
        local frame = value:sub(1, -(MAC_BYTES + SEAL_BYTES) - 1)
        if value:sub(-(MAC_BYTES + SEAL_BYTES), -SEAL_BYTES - 1) == mac('c\0' .. frame) then
            local ok, i1, v1 = pcall(parse, frame, rank)
            if ok then
                idx, val = i1, v1
            end
        end
    end
    if value and not idx then
        rejected[#rejected + 1] = rank
    elseif idx then
        updates[#updates + 1] = { idx, val }
        first = first or rank
        total = total + #idx
        for j = 1, #idx do
            local x = idx[j]
            if x < lo then lo = x end
            if x > hi then hi = x end
        end
    end
end
if #missing > 0 then
    return missing
end

-- The sums and carrier counts of the union, in index order: over the range in arrays (Lua's array part) when the
-- entries fill enough of it, in a hash and sorted otherwise.
local added, entries, esum, ecount = #updates, {}, {}, {}
if total >= DENSE_ENOUGH * (hi - lo + 1) then
    local span, at_sum, at_count = hi - lo + 1, {}, {}
    for k = 1, span do
        at_sum[k], at_count[k] = 0, 0
    end
    for u = 1, added do
        local idx, val = updates[u][1], updates[u][2]
        for j = 1, #idx do
            local k = idx[j] - lo + 1
            at_sum[k], at_count[k] = at_sum[k] + val[j], at_count[k] + 1
        end
    end
    local e = 0
    for k = 1, span do
        if at_count[k] > 0 then
            e = e + 1
            entries[e], esum[e], ecount[e] = lo + k - 1, at_sum[k], at_count[k]
        end
    end
else
    local sums, counts = {}, {}
    for u = 1, added do
        local idx, val = updates[u][1], updates[u][2]
        for j = 1, #idx do
            local x = idx[j]
            local c = counts[x]
            if c then
                sums[x], counts[x] = sums[x] + val[j], c + 1
            else
                sums[x], counts[x] = val[j], 1
                entries[#entries + 1] = x
            end
        end
    end
    table.sort(entries)
    for e = 1, #entries do
        esum[e], ecount[e] = sums[entries[e]], counts[entries[e]]
    end
end

-- The merged partition as sync/exchanges/reduce.py writes it: the sums, then each entry whose count is not the usual
-- one as N + index with its count, then 2N with the usual count.
local out_idx, out_val = {}, {}
if added > 0 then
    local full = 0
    for e = 1, #entries do
        if ecount[e] == added then full = full + 1 end
    end
    local usual = (2 * full > #entries) and added or 1
    local odd_idx, odd_val = {}, {}
    for e = 1, #entries do
        local x = entries[e]
        out_idx[e], out_val[e] = x, esum[e]
        if ecount[e] ~= usual then
            odd_idx[#odd_idx + 1], odd_val[#odd_val + 1] = x + size, ecount[e]
        end
    end
    for j = 1, #odd_idx do
        out_idx[#out_idx + 1], out_val[#out_val + 1] = odd_idx[j], odd_val[j]
    end
    out_idx[#out_idx + 1], out_val[#out_val + 1] = 2 * size, usual
end

-- Indices as runs when there are fewer than half as many runs as entries, as protocol/index_runs.py decides.
local n, starts, lengths = #out_idx, {}, {}
for j = 1, n do
    if j == 1 or out_idx[j] ~= out_idx[j - 1] + 1 then
        starts[#starts + 1], lengths[#lengths + 1] = out_idx[j], 1
    else
        lengths[#lengths] = lengths[#lengths] + 1
    end
end
local parts = {}
if n < 3 or 2 * #starts >= n then
    parts[1] = struct.pack('<I4I4', n, 0)
    pack_many('i4', out_idx, parts)
else
    parts[1] = struct.pack('<I4I4', n, #starts)
    pack_many('i4', starts, parts)
    pack_many('I4', lengths, parts)
end
pack_many('f', out_val, parts)
local payload = table.concat(parts)
-- Its sender: the lowest rank added (an Update frame carries a worker's rank), the first sender if none was.
local sender = first or tonumber(ARGV[8])
local frame = struct.pack(HEADER, 'MLs', VERSION, UPDATE, SEALED, sender, step, #payload, 0) .. payload
local record = prefix .. table.concat(rejected, ',') .. '|'
record = record .. mac('m\0' .. record .. frame) .. frame
redis.call('SET', KEYS[1], record, 'EX', ttl)
return record
