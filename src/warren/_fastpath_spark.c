/* warren._fastpath: the Spark connector's loops over rows.
 *
 * scan_stream_deliveries() is the source's read loop (spark/scan.py's Scanner,
 * the reference) for deliveries of a stream's common shape, into the column
 * buffers of spark/column_buffers.py; encode_publishes() is the sink's
 * (spark/publish.py's Encoder.encode, the reference) for a body column and
 * nothing else.
 *
 * (Rewritten from their callers and tests: tests/spark/test_native_scan.py,
 * tests/spark/test_native_encode.py.)
 */
#include "_fastpath.h"

#define BASIC_DELIVER ((60u << 16) | 60u)
#define F_HEADERS 0x2000
#define F_DELIVERY_MODE 0x1000

/* The stream's two headers as Warren and RabbitMQ write them: name, type 'l'. */
static const char OFFSET_ENTRY[] = "\x0fx-stream-offsetl";   /* 17 bytes, then 8 */
static const char STAMP_ENTRY[] = "\x12x-stream-timestampl"; /* 20 bytes, then 8 */
#define OFFSET_ENTRY_LEN 17
#define STAMP_ENTRY_LEN 20
#define TABLE_LEN (OFFSET_ENTRY_LEN + 8 + STAMP_ENTRY_LEN + 8)

/* Append len bytes to a bytearray (its resize over-allocates as it grows). */
static int ba_append(PyObject *ba, const void *src, Py_ssize_t len) {
    Py_ssize_t old = PyByteArray_GET_SIZE(ba);
    if (PyByteArray_Resize(ba, old + len) < 0) return -1;
    if (len) memcpy(PyByteArray_AS_STRING(ba) + old, src, (size_t)len);
    return 0;
}

/* Append a value to an Arrow binary column: its bytes to data, its end to ends. */
static int binary_append(PyObject *data, PyObject *ends, const unsigned char *src,
                         Py_ssize_t len) {
    Py_ssize_t end = PyByteArray_GET_SIZE(data) + len;
    if (end > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "scan_stream_deliveries: a column past 2 GiB");
        return -1;
    }
    int32_t e = (int32_t)end;
    if (ba_append(data, src, len) < 0) return -1;
    return ba_append(ends, &e, 4);
}

enum { SCAN_OTHER = 0, SCAN_DONE = 1, SCAN_FIRST = 2, SCAN_FULL = 3, SCAN_INCOMPLETE = 4 };

/* scan_stream_deliveries(buf, pos, start, last, first_seen, max_rows, max_bytes, columns)
 *     -> (pos, deliveries, tag, status, offset)
 *
 * Reads the deliveries from buf[pos] on while they have the stream's common
 * shape: basic.deliver, a content header whose only property is a headers
 * table of x-stream-offset and x-stream-timestamp (both 'l'), the body in one
 * frame (or none when empty). Each delivery of offsets start .. last is
 * appended to columns (column_buffers.py's eight bytearrays: offsets and
 * timestamps as native int64; body, exchange and routing key as data and
 * int32 ends); deliveries before start are read and skipped, as scan.py's
 * Python paths do.
 *
 * Returns where it stopped, how many deliveries it read (the skipped ones
 * too), the last one's delivery tag, and why it stopped (status):
 *   0  the next frame is something else (another shape, a heartbeat, a close):
 *      the Python path reads it;
 *   1  done: the delivery of offset last (or a later one) was read;
 *   2  the next delivery is the first of the read (first_seen false): its
 *      offset is returned and it is not read (the caller checks for data loss,
 *      then calls again);
 *   3  the batch is full (max_rows rows or max_bytes body bytes);
 *   4  the next delivery is not all in buf yet.
 */
PyObject *scan_stream_deliveries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "scan_stream_deliveries(buf, pos, start, last, "
                                         "first_seen, max_rows, max_bytes, columns)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long long start = PyLong_AsLongLong(args[2]);
    long long last = PyLong_AsLongLong(args[3]);
    int first_seen = PyObject_IsTrue(args[4]);
    Py_ssize_t max_rows = PyLong_AsSsize_t(args[5]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred() || first_seen < 0) return NULL;
    PyObject *columns = args[7];
    if (!PyTuple_Check(columns) || PyTuple_GET_SIZE(columns) != 8) {
        PyErr_SetString(PyExc_TypeError, "scan_stream_deliveries: columns must be 8 bytearrays");
        return NULL;
    }
    PyObject *col[8];
    for (int i = 0; i < 8; i++) {
        col[i] = PyTuple_GET_ITEM(columns, i);
        if (!PyByteArray_Check(col[i])) {
            PyErr_SetString(PyExc_TypeError,
                            "scan_stream_deliveries: columns must be 8 bytearrays");
            return NULL;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    if (pos < 0 || pos > n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan_stream_deliveries: pos out of range");
        return NULL;
    }

    Py_ssize_t got = 0;
    uint64_t tag = 0;
    long long offset = -1;
    int status;
    for (;;) {
        if (n - pos < 7) {
            status = SCAN_INCOMPLETE;
            break;
        }
        if (p[pos] != 1) {
            status = SCAN_OTHER;
            break;
        }
        Py_ssize_t fend = pos + 7 + (Py_ssize_t)be32(p + pos + 3); /* the method's end octet */
        if (fend >= n) {
            status = SCAN_INCOMPLETE;
            break;
        }
        if (fend - pos < 12 || be32(p + pos + 7) != BASIC_DELIVER) {
            status = SCAN_OTHER;
            break;
        }
        Py_ssize_t d = pos + 12 + p[pos + 11]; /* past the consumer tag */
        if (d + 10 > fend) {
            status = SCAN_OTHER;
            break;
        }
        Py_ssize_t ex_at = d + 10;
        Py_ssize_t rk_at = ex_at + p[d + 9];
        if (rk_at >= fend) {
            status = SCAN_OTHER;
            break;
        }
        Py_ssize_t rk_end = rk_at + 1 + p[rk_at];
        if (rk_end > fend) {
            status = SCAN_OTHER;
            break;
        }
        Py_ssize_t h = fend + 1; /* the content header frame */
        if (n - h < 21) {
            status = SCAN_INCOMPLETE;
            break;
        }
        Py_ssize_t hend = h + 7 + (Py_ssize_t)be32(p + h + 3);
        if (hend >= n) {
            status = SCAN_INCOMPLETE;
            break;
        }
        /* The shape: headers only, a table of the two entries (either order). */
        if (p[h] != 2 || hend - h != 7 + 14 + 4 + TABLE_LEN || be16(p + h + 19) != F_HEADERS ||
            be32(p + h + 21) != TABLE_LEN) {
            status = SCAN_OTHER;
            break;
        }
        Py_ssize_t t = h + 25;
        Py_ssize_t offset_at, stamp_at;
        if (memcmp(p + t, OFFSET_ENTRY, OFFSET_ENTRY_LEN) == 0 &&
            memcmp(p + t + OFFSET_ENTRY_LEN + 8, STAMP_ENTRY, STAMP_ENTRY_LEN) == 0) {
            offset_at = t + OFFSET_ENTRY_LEN;
            stamp_at = t + OFFSET_ENTRY_LEN + 8 + STAMP_ENTRY_LEN;
        } else if (memcmp(p + t, STAMP_ENTRY, STAMP_ENTRY_LEN) == 0 &&
                   memcmp(p + t + STAMP_ENTRY_LEN + 8, OFFSET_ENTRY, OFFSET_ENTRY_LEN) == 0) {
            stamp_at = t + STAMP_ENTRY_LEN;
            offset_at = t + STAMP_ENTRY_LEN + 8 + OFFSET_ENTRY_LEN;
        } else {
            status = SCAN_OTHER;
            break;
        }
        uint64_t body_size = be64(p + h + 11);
        Py_ssize_t b = hend + 1; /* the body frame */
        Py_ssize_t after = b;
        if (body_size) {
            if (n - b < 7) {
                status = SCAN_INCOMPLETE;
                break;
            }
            if (p[b] != 3 || (uint64_t)be32(p + b + 3) != body_size) { /* split, or odd */
                status = SCAN_OTHER;
                break;
            }
            after = b + 8 + (Py_ssize_t)body_size;
            if (after > n) {
                status = SCAN_INCOMPLETE;
                break;
            }
        }
        long long this_offset = (long long)be64(p + offset_at);
        if (this_offset < 0) { /* the Python path says what is wrong */
            status = SCAN_OTHER;
            break;
        }
        if (!first_seen) {
            offset = this_offset;
            status = SCAN_FIRST;
            break;
        }
        got++;
        tag = be64(p + d);
        pos = after;
        offset = this_offset;
        if (this_offset > last) {
            status = SCAN_DONE;
            break;
        }
        if (this_offset < start) continue;
        int64_t stamp = (int64_t)be64(p + stamp_at);
        int64_t off64 = (int64_t)this_offset;
        if (ba_append(col[0], &off64, 8) < 0 || ba_append(col[1], &stamp, 8) < 0 ||
            binary_append(col[2], col[3], p + b + 7, (Py_ssize_t)body_size) < 0 ||
            binary_append(col[4], col[5], p + ex_at, rk_at - ex_at) < 0 ||
            binary_append(col[6], col[7], p + rk_at + 1, rk_end - rk_at - 1) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (this_offset == last) {
            status = SCAN_DONE;
            break;
        }
        if (PyByteArray_GET_SIZE(col[0]) / 8 >= max_rows ||
            PyByteArray_GET_SIZE(col[2]) >= max_bytes) {
            status = SCAN_FULL;
            break;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnKiL)", pos, got, (unsigned long long)tag, status, offset);
}

/* Decimal digits of v into o; returns the end. */
static unsigned char *put_decimal(unsigned char *o, unsigned long long v) {
    unsigned char tmp[20];
    int k = 0;
    do {
        tmp[k++] = (unsigned char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k) *o++ = tmp[--k];
    return o;
}

static int decimal_len(unsigned long long v) {
    int k = 1;
    while (v >= 10) {
        v /= 10;
        k++;
    }
    return k;
}

/* encode_publishes(data, ends, at, lo, hi, method, prefix, first_row, entry, persistent,
 *                  frame_max) -> bytes
 *
 * spark/publish.py's Encoder.encode for rows lo .. hi - 1 of a body column and
 * nothing else: the column as Arrow's binary layout (data; ends, native int32,
 * the column's row r at ends[at + r] .. ends[at + r + 1]). Per row: method (the
 * whole basic.publish frame every row shares), a content header on channel 1
 * whose headers table has one entry, entry (the deduplication header's name
 * and 'S') with prefix + the decimal row number first_row + r, delivery-mode 2
 * after it when persistent, and the body in frames of at most frame_max - 8
 * octets (none when empty). */
PyObject *encode_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_publishes(data, ends, at, lo, hi, method, prefix, first_row, "
                        "entry, persistent, frame_max)");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[2]);
    Py_ssize_t lo = PyLong_AsSsize_t(args[3]);
    Py_ssize_t hi = PyLong_AsSsize_t(args[4]);
    unsigned long long first_row = PyLong_AsUnsignedLongLong(args[7]);
    int persistent = PyObject_IsTrue(args[9]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[10]);
    if (PyErr_Occurred() || persistent < 0) return NULL;
    if (!PyBytes_Check(args[5]) || !PyBytes_Check(args[6]) || !PyBytes_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError, "encode_publishes: method, prefix and entry are bytes");
        return NULL;
    }
    if (frame_max <= 8 || at < 0 || lo < 0 || hi < lo) {
        PyErr_SetString(PyExc_ValueError, "encode_publishes: bad frame_max or range");
        return NULL;
    }
    Py_ssize_t chunk = frame_max - 8;
    const unsigned char *method = (const unsigned char *)PyBytes_AS_STRING(args[5]);
    Py_ssize_t method_len = PyBytes_GET_SIZE(args[5]);
    const unsigned char *prefix = (const unsigned char *)PyBytes_AS_STRING(args[6]);
    Py_ssize_t prefix_len = PyBytes_GET_SIZE(args[6]);
    const unsigned char *entry = (const unsigned char *)PyBytes_AS_STRING(args[8]);
    Py_ssize_t entry_len = PyBytes_GET_SIZE(args[8]);

    Py_buffer data, ends;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &ends, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *out = NULL;
    const unsigned char *dp = (const unsigned char *)data.buf;
    const unsigned char *eb = (const unsigned char *)ends.buf;
    if ((at + hi + 1) * 4 > ends.len) {
        PyErr_SetString(PyExc_ValueError, "encode_publishes: rows past the ends buffer");
        goto done;
    }
    /* Sizes first (and the bodies' bounds): one allocation. */
    Py_ssize_t total = 0;
    for (Py_ssize_t r = lo; r < hi; r++) {
        int32_t s, e;
        memcpy(&s, eb + 4 * (at + r), 4);
        memcpy(&e, eb + 4 * (at + r + 1), 4);
        if (s < 0 || e < s || e > data.len) {
            PyErr_SetString(PyExc_ValueError, "encode_publishes: a body outside the data");
            goto done;
        }
        Py_ssize_t size = e - s;
        Py_ssize_t key_len = prefix_len + decimal_len(first_row + (unsigned long long)r);
        Py_ssize_t raw = 4 + entry_len + 4 + key_len + persistent;
        total += method_len + 8 + 14 + raw;
        if (size) total += size + 8 * ((size - 1) / chunk + 1);
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t r = lo; r < hi; r++) {
        int32_t s, e;
        memcpy(&s, eb + 4 * (at + r), 4);
        memcpy(&e, eb + 4 * (at + r + 1), 4);
        Py_ssize_t size = e - s;
        unsigned long long row = first_row + (unsigned long long)r;
        Py_ssize_t key_len = prefix_len + decimal_len(row);
        Py_ssize_t table = entry_len + 4 + key_len;
        Py_ssize_t raw = 4 + table + persistent;
        memcpy(o, method, (size_t)method_len);
        o += method_len;
        o = put_frame_head(o, 2, 1, (uint32_t)(14 + raw));
        *o++ = 0; *o++ = 60; *o++ = 0; *o++ = 0; /* class 60, weight 0 */
        o = put_be64(o, (uint64_t)size);
        unsigned flags = F_HEADERS | (persistent ? F_DELIVERY_MODE : 0);
        *o++ = (unsigned char)(flags >> 8);
        *o++ = (unsigned char)flags;
        o = put_be32(o, (uint32_t)table);
        memcpy(o, entry, (size_t)entry_len);
        o += entry_len;
        o = put_be32(o, (uint32_t)key_len);
        memcpy(o, prefix, (size_t)prefix_len);
        o = put_decimal(o + prefix_len, row);
        if (persistent) *o++ = 2;
        *o++ = 0xCE;
        for (Py_ssize_t a = 0; a < size; a += chunk) {
            Py_ssize_t part = size - a < chunk ? size - a : chunk;
            o = put_frame_head(o, 3, 1, (uint32_t)part);
            memcpy(o, dp + s + a, (size_t)part);
            o += part;
            *o++ = 0xCE;
        }
    }
    if (o != (unsigned char *)PyBytes_AS_STRING(out) + total) { /* sizes and writes disagree */
        Py_CLEAR(out);
        PyErr_SetString(PyExc_SystemError, "encode_publishes: size mismatch");
    }
done:
    PyBuffer_Release(&ends);
    PyBuffer_Release(&data);
    return out;
}
