/* warren._fastpath's shared declarations (its sources: _fastpath.c, the module;
 * _fastpath_scan.c, scan_publishes and scan_acks; _fastpath_run.c, the PublishRun type;
 * _fastpath_deliver.c, deliver_frames; _fastpath_records.c, encode_records and
 * the CRC-32; _fastpath_spark.c, the Spark source's read loop;
 * _fastpath_stream.c, deliver_records: a stream's records to deliveries;
 * _fastpath_chunks.c, deliver_entries: a stream's chunk record to deliveries). The byte helpers and the property-list checks are static inline
 * here, so each file that loops over messages keeps them inlined.
 */
#ifndef WARREN_FASTPATH_H
#define WARREN_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    Py_buffer view;       /* the socket read's bytes, held while the run lives */
    PyObject *method;     /* the basic.publish payload every message shares */
    Py_ssize_t channel;
    Py_ssize_t end;       /* offset just past the run's last frame */
    Py_ssize_t count;
    Py_ssize_t *spans;    /* per message: props start, props end, body start, body end */
    Py_ssize_t *methods;  /* keyed runs: per message, its publish payload's start and size;
                             NULL when every message has the run's method */
} PublishRun;

/* Shared between the files but not exported from the extension: no other
 * library's symbol of the same name can stand in for one of these. */
#if defined(__GNUC__) || defined(__clang__)
#define FP_INTERNAL __attribute__((visibility("hidden")))
#else
#define FP_INTERNAL
#endif

/* The run type (_fastpath_run.c) and the plain property lists it hands out as
 * shared objects: b"\x00\x00", b"\x10\x00\x01", b"\x10\x00\x02" (_fastpath.c). */
FP_INTERNAL extern PyTypeObject PublishRunType;
FP_INTERNAL extern PyObject *plain_props[3];

/* The module's functions (METH_FASTCALL) and what its init needs. */
FP_INTERNAL PyObject *scan_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *scan_acks(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *deliver_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *encode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *encode_stream_records(PyObject *self, PyObject *const *args,
                                            Py_ssize_t nargs);
FP_INTERNAL PyObject *fp_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *fp_crc_ok(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *scan_stream_deliveries(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *fp_find_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *encode_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *deliver_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL PyObject *deliver_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FP_INTERNAL void crc_init(void);
/* Whether a whole segment-store record starts at p[q] within limit, its CRC
 * seeded with seed (_fastpath_records.c). */
/* Set in a record's body length when a native (AMQP 1.0) section, u32 length
 * and bytes, follows the body (store/records.py's NATIVE_FLAG). */
#define RECORD_NATIVE_FLAG (1ull << 63)
/* Set instead in a stream's chunk record (a whole osiris chunk as the body, a
 * trailer section after it: store/records.py's CHUNK_FLAG). Its structure is
 * checked as a native section's; per-message readers stop before it. */
#define RECORD_CHUNK_FLAG (1ull << 62)
FP_INTERNAL int record_checks_out(const unsigned char *p, Py_ssize_t q, Py_ssize_t limit,
                                  uint32_t seed);

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static inline unsigned char *put_be32(unsigned char *o, uint32_t v) {
    o[0] = (unsigned char)(v >> 24);
    o[1] = (unsigned char)(v >> 16);
    o[2] = (unsigned char)(v >> 8);
    o[3] = (unsigned char)v;
    return o + 4;
}
static inline unsigned char *put_be64(unsigned char *o, uint64_t v) {
    return put_be32(put_be32(o, (uint32_t)(v >> 32)), (uint32_t)v);
}
/* A frame's type, channel and payload size. */
static inline unsigned char *put_frame_head(unsigned char *o, unsigned char type, uint16_t channel,
                                            uint32_t size) {
    o[0] = type;
    o[1] = (unsigned char)(channel >> 8);
    o[2] = (unsigned char)channel;
    return put_be32(o + 3, size);
}

/* Index into plain_props of a plain property list, or -1. */
static inline int plain_index(const unsigned char *p, Py_ssize_t len) {
    if (len == 2 && p[0] == 0 && p[1] == 0) return 0;
    if (len == 3 && p[0] == 0x10 && p[1] == 0 && (p[2] == 1 || p[2] == 2)) return p[2];
    return -1;
}

/* The property flags a run may carry beyond delivery-mode: content-type,
 * content-encoding, headers (a simple table: simple_table), priority,
 * correlation-id (first byte), message-id, timestamp, type, app-id (second
 * byte). Not reply-to (direct reply-to's rewrite), expiration (TTL), user-id
 * (checked against the login), cluster-id, a continued flag word. */
#define SIMPLE_FLAGS_0 (0x80 | 0x40 | 0x20 | 0x10 | 0x08 | 0x04)
#define SIMPLE_FLAGS_1 (0x80 | 0x40 | 0x20 | 0x08)
#define MAX_TIMESTAMP 253402300799ull /* the year 9999, as core/table.py */

/* The end of the headers table at p[at] when it is flat and plain: ASCII keys,
 * values of fixed size (not floats), u32-sized strings ('S', 'x') or
 * timestamps before the year 10000, lengths that add up; -1 otherwise (nested
 * tables and arrays, floats, anything malformed go the slow way).
 * publish_run.py's _simple_table is the reference. */
static inline Py_ssize_t simple_table(const unsigned char *p, Py_ssize_t at, Py_ssize_t len) {
    if (len - at < 4) return -1;
    Py_ssize_t end = at + 4 + (Py_ssize_t)be32(p + at);
    if (end > len || end < at) return -1;
    at += 4;
    while (at < end) {
        Py_ssize_t key_end = at + 1 + p[at];
        if (key_end >= end) return -1;
        for (Py_ssize_t i = at + 1; i < key_end; i++)
            if (p[i] & 0x80) return -1;
        unsigned char tag = p[key_end];
        at = key_end + 1;
        switch (tag) {
        case 't': case 'b': case 'B': at += 1; break;
        case 's': case 'u': at += 2; break;
        case 'I': case 'i': at += 4; break;
        case 'l': case 'L': at += 8; break;
        case 'D': at += 5; break;
        case 'V': break;
        case 'S': case 'x':
            if (end - at < 4) return -1;
            at += 4 + (Py_ssize_t)be32(p + at);
            break;
        case 'T':
            if (end - at < 8 || be64(p + at) > MAX_TIMESTAMP) return -1;
            at += 8;
            break;
        default: return -1;
        }
    }
    return at == end ? end : -1;
}

/* Whether the bytes "CC" occur in p[0:len] (check_message's and routing's test
 * for CC/BCC headers). */
static inline int has_cc(const unsigned char *p, Py_ssize_t len) {
    for (Py_ssize_t i = 0; i + 1 < len; i++)
        if (p[i] == 'C' && p[i + 1] == 'C') return 1;
    return 0;
}

/* Whether p[0:len] is a property list made only of those, well formed and
 * what amqp/publishing.py's checks would pass without a word (ASCII short strings,
 * delivery-mode 1 or 2, a timestamp before the year 10000, a simple headers
 * table without the bytes "CC"); *mode gets its delivery-mode (0: none).
 * Anything else goes the slow way. */
static inline int simple_props(const unsigned char *p, Py_ssize_t len, int *mode) {
    *mode = 0;
    if (len < 2 || (p[0] & ~SIMPLE_FLAGS_0) || (p[1] & ~SIMPLE_FLAGS_1)) return 0;
    unsigned flags = (unsigned)p[0] << 8 | p[1];
    if ((flags & 0x2000) && has_cc(p, len)) return 0;
    Py_ssize_t at = 2;
    for (int bit = 15; bit >= 1; bit--) {
        if (!(flags & (1u << bit))) continue;
        switch (bit) {
        case 12: /* delivery-mode */
        case 11: /* priority */
            if (at >= len) return 0;
            if (bit == 12) {
                if (p[at] != 1 && p[at] != 2) return 0;
                *mode = p[at];
            }
            at += 1;
            break;
        case 6: /* timestamp */
            if (len - at < 8 || be64(p + at) > MAX_TIMESTAMP) return 0;
            at += 8;
            break;
        case 13: /* headers */
            at = simple_table(p, at, len);
            if (at < 0) return 0;
            break;
        default: { /* a short string */
            if (at >= len) return 0;
            Py_ssize_t end = at + 1 + p[at];
            if (end > len) return 0;
            for (Py_ssize_t i = at + 1; i < end; i++)
                if (p[i] & 0x80) return 0;
            at = end;
        }
        }
    }
    return at == len;
}

#endif /* WARREN_FASTPATH_H */
