/* warren._fastpath: scan_publishes, the runs of alike basic.publish messages in
 * one socket read (amqp/publish_run.py's scan_publishes is the reference).
 */
#include "_fastpath.h"

/* basic.publish's payload: reserved short, two shortstrs, the bits octet, exactly. */
static int method_ok(const unsigned char *m, Py_ssize_t len) {
    if (len < 9 || m[0] != 0 || m[1] != 0x3c || m[2] != 0 || m[3] != 0x28) return 0;
    Py_ssize_t at = 7 + m[6];
    if (at >= len) return 0;
    return at + 1 + m[at] + 1 == len;
}

/* One complete message at pos whose method payload is m[0:mlen]: fills
 * spans[0..3] and *next, or returns 0. */
static int one_message(const unsigned char *d, Py_ssize_t n, Py_ssize_t pos, uint16_t channel,
                       const unsigned char *m, Py_ssize_t mlen, int keyed, uint32_t frame_max,
                       uint64_t max_body, Py_ssize_t *spans, Py_ssize_t *method_span,
                       Py_ssize_t *next) {
    Py_ssize_t end;
    if (!keyed) {
        /* The method frame, byte for byte the run's first. */
        end = pos + 7 + mlen;
        if (end >= n || d[pos] != 1 || be16(d + pos + 1) != channel ||
            be32(d + pos + 3) != (uint32_t)mlen || d[end] != 0xCE ||
            memcmp(d + pos + 7, m, (size_t)mlen) != 0)
            return 0;
    } else {
        /* A publish to the run's exchange with its bits; any routing key. */
        if (n - pos < 7 || d[pos] != 1 || be16(d + pos + 1) != channel) return 0;
        uint32_t size = be32(d + pos + 3);
        if (frame_max && size > frame_max) return 0;
        if ((Py_ssize_t)size >= n - pos - 7) return 0;
        end = pos + 7 + (Py_ssize_t)size;
        const unsigned char *p = d + pos + 7;
        Py_ssize_t plen = (Py_ssize_t)size;
        Py_ssize_t ex_end = 7 + m[6]; /* reserved short, ids and the exchange shortstr */
        if (d[end] != 0xCE || !method_ok(p, plen) || p[6] != m[6] ||
            memcmp(p, m, (size_t)ex_end) != 0 || p[plen - 1] != m[mlen - 1])
            return 0;
        method_span[0] = pos + 7;
        method_span[1] = plen;
    }
    pos = end + 1;
    /* The content header frame. */
    if (n - pos < 7) return 0;
    uint32_t size = be32(d + pos + 3);
    if (d[pos] != 2 || be16(d + pos + 1) != channel || size < 14) return 0;
    if (frame_max && size > frame_max) return 0;
    if ((Py_ssize_t)size >= n - pos - 7) return 0; /* end octet not in the buffer */
    end = pos + 7 + (Py_ssize_t)size;
    if (d[end] != 0xCE) return 0;
    const unsigned char *h = d + pos + 7;
    if (be16(h) != 60 || be16(h + 2) != 0) return 0;
    uint64_t body_size = be64(h + 4);
    if (body_size > max_body) return 0;
    Py_ssize_t props_start = pos + 19;
    int mode;
    if (plain_index(d + props_start, end - props_start) < 0 &&
        !simple_props(d + props_start, end - props_start, &mode))
        return 0;
    spans[0] = props_start;
    spans[1] = end;
    pos = end + 1;
    if (body_size == 0) {
        spans[2] = spans[3] = pos;
        *next = pos;
        return 1;
    }
    /* One body frame carrying the whole body. */
    if (n - pos < 7) return 0;
    size = be32(d + pos + 3);
    if (d[pos] != 3 || be16(d + pos + 1) != channel || (uint64_t)size != body_size) return 0;
    if (frame_max && size > frame_max) return 0;
    if ((Py_ssize_t)size >= n - pos - 7) return 0;
    end = pos + 7 + (Py_ssize_t)size;
    if (d[end] != 0xCE) return 0;
    spans[2] = pos + 7;
    spans[3] = end;
    *next = end + 1;
    return 1;
}

PyObject *scan_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "scan_publishes(data, pos, frame_max, max_body, limit, keyed=False)");
        return NULL;
    }
    int keyed = nargs == 6 ? PyObject_IsTrue(args[5]) : 0;
    if (keyed < 0) return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    unsigned long long frame_max = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long max_body = PyLong_AsUnsignedLongLong(args[3]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (frame_max > UINT32_MAX) frame_max = 0; /* no limit a frame could exceed */
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *d = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    if (pos < 0 || n - pos < 7 || limit < 1) goto none;
    uint16_t channel = be16(d + pos + 1);
    uint32_t size = be32(d + pos + 3);
    if (d[pos] != 1 || channel == 0 || size < 7) goto none;
    if (frame_max && size > frame_max) goto none;
    if ((Py_ssize_t)size > n - pos - 7) goto none;
    const unsigned char *m = d + pos + 7;
    Py_ssize_t mlen = (Py_ssize_t)size;
    if (!method_ok(m, mlen) || (m[mlen - 1] & 2)) goto none; /* 2: immediate */
    if (m[mlen - 1] & 1) keyed = 0; /* mandatory: returns come back in publish order */

    Py_ssize_t cap = limit < 64 ? limit : 64;
    Py_ssize_t *spans = PyMem_Malloc((size_t)cap * 4 * sizeof(Py_ssize_t));
    Py_ssize_t *methods = keyed ? PyMem_Malloc((size_t)cap * 2 * sizeof(Py_ssize_t)) : NULL;
    if (spans == NULL || (keyed && methods == NULL)) {
        PyMem_Free(spans);
        PyMem_Free(methods);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Py_ssize_t count = 0, at = pos, next = pos;
    int uniform = 1;
    while (count < limit) {
        if (count == cap) {
            Py_ssize_t grown = cap * 4 < limit ? cap * 4 : limit;
            Py_ssize_t *more = PyMem_Realloc(spans, (size_t)grown * 4 * sizeof(Py_ssize_t));
            if (more != NULL) spans = more;
            Py_ssize_t *more_m = NULL;
            if (more != NULL && keyed) {
                more_m = PyMem_Realloc(methods, (size_t)grown * 2 * sizeof(Py_ssize_t));
                if (more_m != NULL) methods = more_m;
            }
            if (more == NULL || (keyed && more_m == NULL)) {
                PyMem_Free(spans);
                PyMem_Free(methods);
                PyBuffer_Release(&view);
                return PyErr_NoMemory();
            }
            cap = grown;
        }
        if (!one_message(d, n, at, channel, m, mlen, keyed, (uint32_t)frame_max, max_body,
                         spans + 4 * count, keyed ? methods + 2 * count : NULL, &next))
            break;
        if (keyed && (methods[2 * count + 1] != mlen ||
                      memcmp(d + methods[2 * count], m, (size_t)mlen) != 0))
            uniform = 0;
        at = next;
        count++;
    }
    if (count == 0) {
        PyMem_Free(spans);
        PyMem_Free(methods);
        goto none;
    }
    if (uniform) { /* every routing key alike: a plain run */
        PyMem_Free(methods);
        methods = NULL;
    }
    PublishRun *run = PyObject_New(PublishRun, &PublishRunType);
    if (run == NULL) {
        PyMem_Free(spans);
        PyMem_Free(methods);
        PyBuffer_Release(&view);
        return NULL;
    }
    run->spans = NULL;
    run->methods = NULL;
    run->method = PyBytes_FromStringAndSize((const char *)m, mlen);
    if (run->method == NULL) {
        run->view = view;
        Py_DECREF(run);
        PyMem_Free(spans);
        PyMem_Free(methods);
        return NULL;
    }
    run->view = view; /* the run now holds the buffer */
    run->channel = channel;
    run->end = at;
    run->count = count;
    run->spans = spans;
    run->methods = methods;
    return (PyObject *)run;

none:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* Whether a run may start with a frame of class and method ``ids`` and flags
 * ``bits``: basic.ack (80) with multiple clear, basic.reject (90) requeue or
 * not, basic.nack (120) with multiple clear, requeue or not. */
static int settles_singly(uint32_t ids, unsigned char bits) {
    switch (ids) {
    case 0x003C0050u: return bits == 0;
    case 0x003C005Au: return bits <= 1;
    case 0x003C0078u: return bits == 0 || bits == 2;
    default: return 0;
    }
}

/* scan_acks(data, pos, max_n) -> (n, first_tag, end)
 *
 * The run of frames that starts at data[pos]: method frames on one channel
 * (the first's), each the first one's method (a basic.ack with multiple
 * clear, a basic.reject, or a basic.nack with multiple clear) with the first
 * one's flags octet, their delivery tags counting up by one from the
 * first's; at most max_n of them, every frame complete with its end octet.
 * What a client acking (or rejecting) delivery after delivery sends, settled
 * together (amqp/ack_scan.py's scan_acks_python is the reference). n == 0
 * when not even the first frame is one: (0, 0, pos). */
PyObject *scan_acks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan_acks(data, pos, max_n)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_n = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *d = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len;
    Py_ssize_t n = 0;
    Py_ssize_t at = pos < 0 ? len : pos;
    uint64_t first = 0;
    uint16_t channel = 0;
    uint32_t ids = 0;
    unsigned char bits = 0;
    /* type 1, channel, size 13, class 60, a method, the tag, the bits, 0xCE: 21 octets */
    while (n < max_n && len - at >= 21) {
        const unsigned char *f = d + at;
        if (f[0] != 1 || be32(f + 3) != 13 || f[20] != 0xCE) break;
        uint64_t tag = be64(f + 11);
        if (n == 0) {
            ids = be32(f + 7);
            bits = f[19];
            if (!settles_singly(ids, bits)) break;
            channel = be16(f + 1);
            first = tag;
        } else if (be16(f + 1) != channel || tag != first + (uint64_t)n || be32(f + 7) != ids ||
                   f[19] != bits) {
            break;
        }
        n++;
        at += 21;
    }
    PyBuffer_Release(&view);
    if (n == 0) return Py_BuildValue("(nKn)", (Py_ssize_t)0, 0ULL, pos);
    return Py_BuildValue("(nKn)", n, (unsigned long long)first, at);
}
