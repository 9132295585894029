/* warren._fastpath: deliver_records, a stream's stored records to deliveries.
 *
 * (Rewritten from its callers and tests: core/stream_queue.py's backlog path,
 * amqp/consumer.py's AMQPConsumer.deliver_records, tests/core/test_stream_spans.py.)
 */
#include "_fastpath.h"

/* deliver_records(buf, pos, limit, seed, max_n, channel, deliver_head, first_tag, frame_max,
 *                 redelivered=0, expired_at=-1, own_expiry=0, max_bytes=0)
 *     -> (frames, n, end, sizes, offsets)
 *
 * The segment-store records from buf[pos] on (a memory map up to limit, their
 * CRC-32 seeded with seed, the segment's salt), at most max_n of them, as the
 * deliveries a consumer gets, in one bytes object: per record a basic.deliver
 * method frame (deliver_head: class, method and the consumer tag as a
 * shortstr; the delivery tag counting up from first_tag, the redelivered bit,
 * the record's exchange and routing key as stored), the content header with
 * the stored properties and the body in frames of at most frame_max - 8
 * octets: what AMQPConsumer.deliver (amqp/frames.py's message_frames) writes
 * one at a time. amqp/record_deliveries.py's deliver_records_python is the
 * reference, in every detail (tests/core/test_backlog_spans.py).
 *
 * Each record is checked first as store/records.py's decode_record does
 * (length bounds, inner lengths adding up, the CRC): the span stops before the
 * first one that does not check out (damage), which the one-by-one path then
 * deals with. It also stops before a record whose timestamp is at or below
 * expired_at (a queue TTL's: expired; -1: no such check), one that carries its
 * own expiration property when own_expiry is set (its deadline is the
 * one-by-one path's to work out), and before the record that would take the
 * frames past max_bytes (0: no limit; the first record always goes). n: how
 * many records were framed; end: where the next starts; sizes and offsets:
 * each body's size and each record's position, as native u32s
 * (array("I").frombytes). n == 0 returns (b"", 0, pos, b"", b""). The buffer
 * is released before returning, so the map can be closed. */
PyObject *deliver_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 9 || nargs > 13) {
        PyErr_SetString(PyExc_TypeError, "deliver_records(buf, pos, limit, seed, max_n, channel, "
                                         "deliver_head, first_tag, frame_max, redelivered=0, "
                                         "expired_at=-1, own_expiry=0, max_bytes=0)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    unsigned long seed = PyLong_AsUnsignedLong(args[3]);
    Py_ssize_t max_n = PyLong_AsSsize_t(args[4]);
    Py_ssize_t channel = PyLong_AsSsize_t(args[5]);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[7]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[8]);
    int redelivered = nargs > 9 ? PyObject_IsTrue(args[9]) : 0;
    long long expired_at = nargs > 10 ? PyLong_AsLongLong(args[10]) : -1;
    int own_expiry = nargs > 11 ? PyObject_IsTrue(args[11]) : 0;
    Py_ssize_t max_bytes = nargs > 12 ? PyLong_AsSsize_t(args[12]) : 0;
    if (PyErr_Occurred() || redelivered < 0 || own_expiry < 0) return NULL;
    if (seed > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_OverflowError, "deliver_records: seed must be a u32");
        return NULL;
    }
    if (!PyBytes_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "deliver_records: deliver_head must be bytes");
        return NULL;
    }
    if (channel < 0 || channel > 0xFFFF || pos < 0) {
        PyErr_SetString(PyExc_ValueError, "deliver_records: bad channel or position");
        return NULL;
    }
    const unsigned char *head = (const unsigned char *)PyBytes_AS_STRING(args[6]);
    Py_ssize_t head_len = PyBytes_GET_SIZE(args[6]);
    Py_ssize_t chunk = frame_max > 8 ? frame_max - 8 : PY_SSIZE_T_MAX;

    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    if (limit > view.len) limit = view.len;

    /* First pass: which records check out, and the size of their frames. */
    Py_ssize_t n = 0;
    Py_ssize_t q = pos;
    Py_ssize_t total = 0;
    while (n < max_n && q < limit && record_checks_out(p, q, limit, (uint32_t)seed)) {
        Py_ssize_t length = (Py_ssize_t)be32(p + q);
        Py_ssize_t ex_len = p[q + 12];
        Py_ssize_t rk_len = p[q + 13 + ex_len];
        Py_ssize_t pl = q + 14 + ex_len + rk_len;
        Py_ssize_t plen = (Py_ssize_t)be32(p + pl);
        uint64_t body_field = be64(p + pl + 4 + plen);
        if (body_field & RECORD_CHUNK_FLAG) break; /* a stream's chunk record: one by one */
        Py_ssize_t body = (Py_ssize_t)(body_field & ~RECORD_NATIVE_FLAG);
        if (expired_at >= 0 && be64(p + q + 4) <= (uint64_t)expired_at) break;
        if (own_expiry && plen >= 2 && (p[pl + 4] & 0x01)) break; /* the expiration flag */
        Py_ssize_t size = 8 + head_len + 9 + 2 + ex_len + rk_len; /* method frame */
        size += 8 + 12 + plen;                                    /* content header */
        if (body) size += body + 8 * ((body - 1) / chunk + 1);
        if (n && max_bytes > 0 && total + size > max_bytes) break;
        total += size;
        q += length;
        n++;
    }
    if (n == 0) {
        PyBuffer_Release(&view);
        return Py_BuildValue("(y#nny#y#)", "", (Py_ssize_t)0, (Py_ssize_t)0, pos, "",
                             (Py_ssize_t)0, "", (Py_ssize_t)0);
    }
    Py_ssize_t end = q;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL || sizes == NULL || offsets == NULL) {
        PyBuffer_Release(&view);
        Py_XDECREF(out);
        Py_XDECREF(sizes);
        Py_XDECREF(offsets);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    uint32_t *size_out = (uint32_t *)PyBytes_AS_STRING(sizes);
    uint32_t *offset_out = (uint32_t *)PyBytes_AS_STRING(offsets);
    uint64_t tag = first_tag;
    for (q = pos; q < end; tag++) {
        Py_ssize_t length = (Py_ssize_t)be32(p + q);
        Py_ssize_t ex_len = p[q + 12];
        Py_ssize_t rk_len = p[q + 13 + ex_len];
        Py_ssize_t ex_rk_len = 2 + ex_len + rk_len;
        Py_ssize_t pl = q + 12 + ex_rk_len;
        Py_ssize_t plen = (Py_ssize_t)be32(p + pl);
        const unsigned char *props = p + pl + 4;
        Py_ssize_t body = (Py_ssize_t)(be64(props + plen) & ~RECORD_NATIVE_FLAG);
        const unsigned char *b = props + plen + 8;
        *size_out++ = (uint32_t)body;
        *offset_out++ = (uint32_t)q;
        o = put_frame_head(o, 1, (uint16_t)channel, (uint32_t)(head_len + 9 + ex_rk_len));
        memcpy(o, head, (size_t)head_len);
        o += head_len;
        o = put_be64(o, tag);
        *o++ = (unsigned char)redelivered;
        memcpy(o, p + q + 12, (size_t)ex_rk_len);
        o += ex_rk_len;
        *o++ = 0xCE;
        o = put_frame_head(o, 2, (uint16_t)channel, (uint32_t)(12 + plen));
        *o++ = 0; *o++ = 60; *o++ = 0; *o++ = 0; /* class 60, weight 0 */
        o = put_be64(o, (uint64_t)body);
        memcpy(o, props, (size_t)plen);
        o += plen;
        *o++ = 0xCE;
        for (Py_ssize_t at = 0; at < body; at += chunk) {
            Py_ssize_t part = body - at < chunk ? body - at : chunk;
            o = put_frame_head(o, 3, (uint16_t)channel, (uint32_t)part);
            memcpy(o, b + at, (size_t)part);
            o += part;
            *o++ = 0xCE;
        }
        q += length;
    }
    PyBuffer_Release(&view);
    if (o != (unsigned char *)PyBytes_AS_STRING(out) + total) { /* sizes and writes disagree */
        Py_DECREF(out);
        Py_DECREF(sizes);
        Py_DECREF(offsets);
        PyErr_SetString(PyExc_SystemError, "deliver_records: size mismatch");
        return NULL;
    }
    return Py_BuildValue("(NnnNN)", out, n, end, sizes, offsets);
}
