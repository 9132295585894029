/* warren._fastpath: deliver_records, a stream's stored records to deliveries.
 *
 * (Rewritten from its callers and tests: core/stream_queue.py's backlog path,
 * amqp/consumer.py's AMQPConsumer.deliver_records, tests/test_stream_spans.py.)
 */
#include "_fastpath.h"

/* deliver_records(buf, pos, limit, seed, max_n, channel, deliver_head, first_tag, frame_max)
 *     -> (frames, n, end, sizes)
 *
 * The segment-store records from buf[pos] on (a memory map up to limit, their
 * CRC-32 seeded with seed, the segment's salt), at most max_n of them, as the
 * deliveries an acknowledging consumer gets, in one bytes object: per record a
 * basic.deliver method frame (deliver_head: class, method and the consumer tag
 * as a shortstr; the delivery tag counting up from first_tag, redelivered 0,
 * the record's exchange and routing key as stored), the content header with
 * the stored properties and the body in frames of at most frame_max - 8
 * octets: what StreamCursor.next and AMQPConsumer.deliver (amqp/frames.py's
 * message_frames) write one at a time, the reference.
 *
 * Each record is checked first as store/records.py's decode_record does
 * (length bounds, inner lengths adding up, the CRC): the span stops before the
 * first one that does not check out (damage), which the one-by-one path then
 * deals with. n: how many records were framed; end: where the next starts;
 * sizes: each body's size as a native u32 (array("I").frombytes). n == 0
 * returns (b"", 0, pos, b""). The buffer is released before returning, so the
 * map can be closed. */
PyObject *deliver_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "deliver_records(buf, pos, limit, seed, max_n, channel, "
                                         "deliver_head, first_tag, frame_max)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    unsigned long seed = PyLong_AsUnsignedLong(args[3]);
    Py_ssize_t max_n = PyLong_AsSsize_t(args[4]);
    Py_ssize_t channel = PyLong_AsSsize_t(args[5]);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[7]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred()) return NULL;
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
        Py_ssize_t body = (Py_ssize_t)be64(p + pl + 4 + plen);
        total += 8 + head_len + 9 + 2 + ex_len + rk_len; /* method frame */
        total += 8 + 12 + plen;                              /* content header */
        if (body) total += body + 8 * ((body - 1) / chunk + 1);
        q += length;
        n++;
    }
    if (n == 0) {
        PyBuffer_Release(&view);
        return Py_BuildValue("(y#nny#)", "", (Py_ssize_t)0, (Py_ssize_t)0, pos, "", (Py_ssize_t)0);
    }
    Py_ssize_t end = q;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL || sizes == NULL) {
        PyBuffer_Release(&view);
        Py_XDECREF(out);
        Py_XDECREF(sizes);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    uint32_t *size_out = (uint32_t *)PyBytes_AS_STRING(sizes);
    uint64_t tag = first_tag;
    for (q = pos; q < end; tag++) {
        Py_ssize_t length = (Py_ssize_t)be32(p + q);
        Py_ssize_t ex_len = p[q + 12];
        Py_ssize_t rk_len = p[q + 13 + ex_len];
        Py_ssize_t ex_rk_len = 2 + ex_len + rk_len;
        Py_ssize_t pl = q + 12 + ex_rk_len;
        Py_ssize_t plen = (Py_ssize_t)be32(p + pl);
        const unsigned char *props = p + pl + 4;
        Py_ssize_t body = (Py_ssize_t)be64(props + plen);
        const unsigned char *b = props + plen + 8;
        *size_out++ = (uint32_t)body;
        o = put_frame_head(o, 1, (uint16_t)channel, (uint32_t)(head_len + 9 + ex_rk_len));
        memcpy(o, head, (size_t)head_len);
        o += head_len;
        o = put_be64(o, tag);
        *o++ = 0; /* redelivered */
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
        PyErr_SetString(PyExc_SystemError, "deliver_records: size mismatch");
        return NULL;
    }
    return Py_BuildValue("(NnnN)", out, n, end, sizes);
}
