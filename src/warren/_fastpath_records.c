/* warren._fastpath: encode_records, the segment-store records of a run's messages,
 * with a slicing-by-8 CRC-32 equal to zlib's (store/records.py's encode_run is the
 * reference).
 */
#include "_fastpath.h"

/* CRC-32 as zlib.crc32 computes it (reflected, polynomial 0xEDB88320),
 * slicing by 8: the segment store's records end with one (store/records.py). */
static uint32_t crc_table[8][256];

void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                            (uint32_t)p[3] << 24);
        crc = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^
              crc_table[5][(a >> 16) & 0xFF] ^ crc_table[4][a >> 24] ^ crc_table[3][p[4]] ^
              crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* The arguments both run encoders share, checked: (run, start, stop, ex_rk,
 * timestamp, _, seed); ``seed`` may be NULL (0). Returns 0 with an exception
 * set when one is wrong; ``name`` names the function in the message. */
typedef struct {
    PublishRun *run;
    Py_ssize_t start, stop, ex_rk_len;
    const unsigned char *ex_rk;
    unsigned long long timestamp;
    unsigned long seed;
} RunArgs;

static int run_args(RunArgs *a, const char *name, PyObject *const *args, PyObject *seed) {
    if (!PyObject_TypeCheck(args[0], &PublishRunType)) {
        PyErr_Format(PyExc_TypeError, "%s: run must be a warren._fastpath.PublishRun", name);
        return 0;
    }
    a->run = (PublishRun *)args[0];
    a->start = PyLong_AsSsize_t(args[1]);
    a->stop = PyLong_AsSsize_t(args[2]);
    a->timestamp = PyLong_AsUnsignedLongLong(args[4]);
    a->seed = seed != NULL ? PyLong_AsUnsignedLong(seed) : 0;
    if (PyErr_Occurred()) return 0;
    if (a->seed > 0xFFFFFFFFul) {
        PyErr_Format(PyExc_OverflowError, "%s: seed must be a u32", name);
        return 0;
    }
    if (!PyBytes_Check(args[3])) {
        PyErr_Format(PyExc_TypeError, "%s: ex_rk must be bytes", name);
        return 0;
    }
    if (a->start < 0 || a->stop > a->run->count || a->start > a->stop) {
        PyErr_Format(PyExc_ValueError, "%s: bad range", name);
        return 0;
    }
    a->ex_rk = (const unsigned char *)PyBytes_AS_STRING(args[3]);
    a->ex_rk_len = PyBytes_GET_SIZE(args[3]);
    return 1;
}

/* encode_records(run, start, stop, ex_rk, timestamp, base, seed=0)
 *     -> (records, offsets, sizes, persistent)
 *
 * store/records.py's encode_run for a C run: the segment-store records of
 * messages start .. stop - 1, back to back in one bytes object (the format of
 * records.encode_record; ex_rk is the exchange and routing key as two
 * shortstrs; each CRC seeded with seed, the segment's salt). offsets: each
 * record's position, base + where it starts in records, and sizes: each
 * body's size, both as native u32 (for array("I").frombytes); persistent: how
 * many have delivery-mode 2. */
PyObject *encode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_records(run, start, stop, ex_rk, timestamp, base, seed=0)");
        return NULL;
    }
    RunArgs a;
    if (!run_args(&a, "encode_records", args, nargs == 7 ? args[6] : NULL)) return NULL;
    unsigned long long base = PyLong_AsUnsignedLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    PublishRun *run = a.run;
    Py_ssize_t start = a.start, stop = a.stop;
    unsigned long long timestamp = a.timestamp;
    unsigned long seed = a.seed;
    const unsigned char *ex_rk = a.ex_rk;
    Py_ssize_t ex_rk_len = a.ex_rk_len;
    const unsigned char *d = (const unsigned char *)run->view.buf;
    Py_ssize_t n = stop - start;

    Py_ssize_t total = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        Py_ssize_t *s = run->spans + 4 * i;
        total += 28 + ex_rk_len + (s[1] - s[0]) + (s[3] - s[2]);
    }
    if ((unsigned long long)total + base > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_OverflowError, "encode_records: offsets past 4 GiB");
        return NULL;
    }
    PyObject *recs = PyBytes_FromStringAndSize(NULL, total);
    PyObject *offs = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, n * 4);
    if (recs == NULL || offs == NULL || sizes == NULL) goto fail;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(recs);
    unsigned char *first = o;
    uint32_t *off_out = (uint32_t *)PyBytes_AS_STRING(offs);
    uint32_t *size_out = (uint32_t *)PyBytes_AS_STRING(sizes);
    Py_ssize_t persistent = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        Py_ssize_t *s = run->spans + 4 * i;
        Py_ssize_t plen = s[1] - s[0];
        Py_ssize_t body = s[3] - s[2];
        Py_ssize_t length = 28 + ex_rk_len + plen + body;
        unsigned char *rec = o;
        *off_out++ = (uint32_t)(base + (unsigned long long)(o - first));
        *size_out++ = (uint32_t)body;
        int mode;
        if (plain_index(d + s[0], plen) == 2 || (simple_props(d + s[0], plen, &mode) && mode == 2))
            persistent++;
        o = put_be32(o, (uint32_t)length);
        o = put_be64(o, timestamp);
        memcpy(o, ex_rk, (size_t)ex_rk_len);
        o += ex_rk_len;
        o = put_be32(o, (uint32_t)plen);
        memcpy(o, d + s[0], (size_t)plen);
        o += plen;
        o = put_be64(o, (uint64_t)body);
        memcpy(o, d + s[2], (size_t)body);
        o += body;
        o = put_be32(o, crc32_update((uint32_t)seed, rec, o - rec));
    }
    if (o != first + total) {
        PyErr_SetString(PyExc_SystemError, "encode_records: size mismatch");
        goto fail;
    }
    PyObject *result = Py_BuildValue("(NNNn)", recs, offs, sizes, persistent);
    return result;

fail:
    Py_XDECREF(recs);
    Py_XDECREF(offs);
    Py_XDECREF(sizes);
    return NULL;
}

/* The two headers a stream stamps on each record (store/stream_records.py's
 * stamp_properties): their keys as a table entry starts (shortstr and the
 * long's tag 'l'), and their size in a table with their two values. */
static const unsigned char OFFSET_KEY[] = "\x0fx-stream-offsetl";
static const unsigned char TIMESTAMP_KEY[] = "\x12x-stream-timestampl";
#define OFFSET_KEY_LEN 17
#define TIMESTAMP_KEY_LEN 20
#define STAMP_SIZE (OFFSET_KEY_LEN + TIMESTAMP_KEY_LEN + 16)

static int contains(const unsigned char *p, Py_ssize_t n, const unsigned char *what,
                    Py_ssize_t k) {
    return n >= k && memmem(p, (size_t)n, what, (size_t)k) != NULL;
}

/* Where a run message's headers table goes (after content-type and
 * content-encoding), and the table's bounds if it has one (*tstart: its u32
 * length; -1: none). 0 when the stamp cannot be spliced in (the table already
 * names x-stream-offset or x-stream-timestamp, or the list is not a run's). */
static int stamp_place(const unsigned char *p, Py_ssize_t len, Py_ssize_t *pos,
                       Py_ssize_t *tstart, Py_ssize_t *tend) {
    if (len < 2 || (p[1] & 1)) return 0;
    unsigned flags = (unsigned)p[0] << 8 | p[1];
    Py_ssize_t at = 2;
    if (flags & 0x8000) {
        if (at >= len) return 0;
        at += 1 + p[at];
    }
    if (flags & 0x4000) {
        if (at >= len) return 0;
        at += 1 + p[at];
    }
    if (at > len) return 0;
    *pos = at;
    *tstart = *tend = -1;
    if (!(flags & 0x2000)) return 1;
    if (len - at < 4) return 0;
    Py_ssize_t end = at + 4 + (Py_ssize_t)be32(p + at);
    if (end > len) return 0;
    if (contains(p + at + 4, end - at - 4, OFFSET_KEY, OFFSET_KEY_LEN - 1) ||
        contains(p + at + 4, end - at - 4, TIMESTAMP_KEY, TIMESTAMP_KEY_LEN - 1))
        return 0;
    *tstart = at;
    *tend = end;
    return 1;
}

/* encode_stream_records(run, start, stop, ex_rk, timestamp, first_offset, seed)
 *     -> (records, ends) | None
 *
 * A stream's records for messages start .. stop - 1 of a run: each message's
 * properties stamped with x-stream-offset (first_offset, first_offset + 1, ...)
 * and x-stream-timestamp (timestamp) as store/stream_records.py's
 * stamp_properties splices them in, then the record as records.encode_record
 * writes it (CRC seeded with seed), back to back. ends: where each record
 * ends in records, as native u32. None when a message's headers already name
 * one of the two (the Python path edits those). store/stream_records.py's
 * run_records is the reference. */
PyObject *encode_stream_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "encode_stream_records(run, start, stop, ex_rk, "
                                         "timestamp, first_offset, seed)");
        return NULL;
    }
    RunArgs a;
    if (!run_args(&a, "encode_stream_records", args, args[6])) return NULL;
    long long first_offset = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    PublishRun *run = a.run;
    Py_ssize_t start = a.start, stop = a.stop;
    unsigned long long timestamp = a.timestamp;
    unsigned long seed = a.seed;
    const unsigned char *ex_rk = a.ex_rk;
    Py_ssize_t ex_rk_len = a.ex_rk_len;
    const unsigned char *d = (const unsigned char *)run->view.buf;
    Py_ssize_t n = stop - start;

    Py_ssize_t total = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        Py_ssize_t *s = run->spans + 4 * i;
        Py_ssize_t pos, ts, te;
        if (!stamp_place(d + s[0], s[1] - s[0], &pos, &ts, &te)) Py_RETURN_NONE;
        Py_ssize_t plen = s[1] - s[0] + STAMP_SIZE + (ts < 0 ? 4 : 0);
        Py_ssize_t length = 28 + ex_rk_len + plen + (s[3] - s[2]);
        if (length > 0xFFFFFFFFll) Py_RETURN_NONE;
        total += length;
    }
    PyObject *recs = PyBytes_FromStringAndSize(NULL, total);
    PyObject *ends = PyBytes_FromStringAndSize(NULL, n * 4);
    if (recs == NULL || ends == NULL) {
        Py_XDECREF(recs);
        Py_XDECREF(ends);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(recs);
    unsigned char *first = o;
    uint32_t *end_out = (uint32_t *)PyBytes_AS_STRING(ends);
    long long offset = first_offset;
    for (Py_ssize_t i = start; i < stop; i++, offset++) {
        Py_ssize_t *s = run->spans + 4 * i;
        const unsigned char *p = d + s[0];
        Py_ssize_t old = s[1] - s[0];
        Py_ssize_t pos, ts, te;
        stamp_place(p, old, &pos, &ts, &te);
        Py_ssize_t plen = old + STAMP_SIZE + (ts < 0 ? 4 : 0);
        Py_ssize_t body = s[3] - s[2];
        Py_ssize_t length = 28 + ex_rk_len + plen + body;
        unsigned char *rec = o;
        o = put_be32(o, (uint32_t)length);
        o = put_be64(o, timestamp);
        memcpy(o, ex_rk, (size_t)ex_rk_len);
        o += ex_rk_len;
        o = put_be32(o, (uint32_t)plen);
        /* The properties: flags (with headers), those before the table, the
         * table with the two entries at its end, the rest. */
        o[0] = p[0] | 0x20;
        o[1] = p[1];
        memcpy(o + 2, p + 2, (size_t)(pos - 2));
        o += pos;
        Py_ssize_t rest;
        if (ts < 0) {
            o = put_be32(o, STAMP_SIZE);
            rest = pos;
        } else {
            o = put_be32(o, be32(p + ts) + STAMP_SIZE);
            memcpy(o, p + ts + 4, (size_t)(te - ts - 4));
            o += te - ts - 4;
            rest = te;
        }
        memcpy(o, OFFSET_KEY, OFFSET_KEY_LEN);
        o = put_be64(o + OFFSET_KEY_LEN, (uint64_t)offset);
        memcpy(o, TIMESTAMP_KEY, TIMESTAMP_KEY_LEN);
        o = put_be64(o + TIMESTAMP_KEY_LEN, timestamp);
        memcpy(o, p + rest, (size_t)(old - rest));
        o += old - rest;
        o = put_be64(o, (uint64_t)body);
        memcpy(o, d + s[2], (size_t)body);
        o += body;
        o = put_be32(o, crc32_update((uint32_t)seed, rec, o - rec));
        *end_out++ = (uint32_t)(o - first);
    }
    if (o != first + total) {
        Py_DECREF(recs);
        Py_DECREF(ends);
        PyErr_SetString(PyExc_SystemError, "encode_stream_records: size mismatch");
        return NULL;
    }
    return Py_BuildValue("(NN)", recs, ends);
}

/* crc32(data, value=0) -> int: zlib.crc32, for the tests of the above. */
PyObject *fp_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0)");
        return NULL;
    }
    unsigned long value = nargs == 2 ? PyLong_AsUnsignedLong(args[1]) : 0;
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t crc = crc32_update((uint32_t)value, (const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* crc_ok(buf, start, end, seed=0) -> bool: whether the u32 big-endian CRC
 * stored at buf[end:end + 4] is the CRC-32 of buf[start:end] seeded with seed
 * (zlib.crc32(data, seed): a version-2 segment's salt, 0 for version 1): a
 * record's check on the read path (store/records.py's _crc_ok is the
 * reference), straight from the buffer (a memory map: no copy of the record,
 * the buffer released before returning, so the map can be closed). False when
 * the range is outside it. */
PyObject *fp_crc_ok(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "crc_ok(buf, start, end, seed=0)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    unsigned long seed = nargs == 4 ? PyLong_AsUnsignedLong(args[3]) : 0;
    if (PyErr_Occurred()) return NULL;
    if (seed > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_OverflowError, "crc_ok: seed must be a u32");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    int ok = 0;
    if (start >= 0 && start <= end && end <= view.len - 4) {
        const unsigned char *p = (const unsigned char *)view.buf;
        ok = crc32_update((uint32_t)seed, p + start, end - start) == be32(p + end);
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* Whether a whole record starts at p[q] within limit: its length in bounds,
 * its inner lengths adding up (a native section after the body included), its
 * CRC-32 (seeded) right: store/records.py's inspect_record is the reference. */
int record_checks_out(const unsigned char *p, Py_ssize_t q, Py_ssize_t limit, uint32_t seed) {
    if (limit - q < 30) return 0;
    uint64_t length = be32(p + q);
    if (length < 30 || length > (uint64_t)(limit - q)) return 0;
    Py_ssize_t end = q + (Py_ssize_t)length - 4;
    Py_ssize_t o = q + 13;
    o += p[o - 1] + 1; /* the exchange, then the routing key's length byte */
    if (o > end) return 0;
    o += p[o - 1] + 4; /* the routing key, then the properties' length */
    if (o > end) return 0;
    o += (Py_ssize_t)be32(p + o - 4) + 8;
    if (o > end) return 0;
    uint64_t body = be64(p + o - 8);
    if (body != (uint64_t)(end - o)) {
        /* Only a record with a native (or chunk trailer) section after the body
         * pays for this. */
        uint64_t flag = body & (RECORD_NATIVE_FLAG | RECORD_CHUNK_FLAG);
        if (flag != RECORD_NATIVE_FLAG && flag != RECORD_CHUNK_FLAG) return 0;
        body &= ~flag;
        if (body > (uint64_t)(end - o) || (uint64_t)(end - o) - body < 4) return 0;
        Py_ssize_t at = o + (Py_ssize_t)body;
        if ((uint64_t)be32(p + at) != (uint64_t)(end - at - 4)) return 0;
    }
    return crc32_update(seed, p + q, end - q) == be32(p + end);
}

/* Whether one of this life's marks lies at p[q]: a u32 0, then the CRC-32 of
 * the offset q (u32, big-endian) and the mark's kind (a byte: 0 end, 1 close)
 * seeded with the salt, its lowest bit set (never 0: zeros are no mark)
 * (store/segment_format.py's mark_at is the reference). */
static int end_mark_at(const unsigned char *p, Py_ssize_t q, Py_ssize_t limit, uint32_t seed) {
    if (limit - q < 8 || be32(p + q) != 0) return 0;
    uint32_t check = be32(p + q + 4);
    if (!check) return 0;
    unsigned char at[5];
    put_be32(at, (uint32_t)q);
    for (unsigned char kind = 0; kind < 2; kind++) {
        at[4] = kind;
        if ((crc32_update(seed, at, 5) | 1u) == check) return 1;
    }
    return 0;
}

/* find_record(buf, start, limit, seed=0, marks=False) -> int: the first offset
 * from start on where a whole record checks out (structure and CRC seeded with
 * seed) or, with marks, this life's end mark lies; -1 when there is none before
 * limit. How damaged bytes are stepped over (store/segment_damage.py's
 * next_record is the reference): every byte is a candidate, and with a salt no
 * record copied from another file is one. */
PyObject *fp_find_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "find_record(buf, start, limit, seed=0, marks=False)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    unsigned long seed = nargs >= 4 ? PyLong_AsUnsignedLong(args[3]) : 0;
    int marks = nargs == 5 ? PyObject_IsTrue(args[4]) : 0;
    if (PyErr_Occurred() || marks < 0) return NULL;
    if (seed > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_OverflowError, "find_record: seed must be a u32");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    if (limit > view.len) limit = view.len;
    Py_ssize_t found = -1;
    if (start < 0) start = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t q = start; q + 8 <= limit; q++) {
        uint32_t length = be32(p + q);
        if (length == 0) {
            if (marks && end_mark_at(p, q, limit, (uint32_t)seed)) {
                found = q;
                break;
            }
            continue;
        }
        if (length >= 30 && record_checks_out(p, q, limit, (uint32_t)seed)) {
            found = q;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(found);
}
