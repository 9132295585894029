/* The kernel as a hand-written CPython extension: one pass checks the frames
 * and sizes the result, a second writes it into one bytes object. No Python
 * object per message. Semantics: fastpath_py.py (the reference). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t rd16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t rd32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t rd64(const unsigned char *p) { return ((uint64_t)rd32(p) << 32) | rd32(p + 4); }
static inline unsigned char *wr16(unsigned char *o, uint16_t v) { o[0] = v >> 8; o[1] = (unsigned char)v; return o + 2; }
static inline unsigned char *wr32(unsigned char *o, uint32_t v) {
    o[0] = v >> 24; o[1] = v >> 16; o[2] = v >> 8; o[3] = (unsigned char)v; return o + 4;
}
static inline unsigned char *wr64(unsigned char *o, uint64_t v) { wr32(o, (uint32_t)(v >> 32)); return wr32(o + 4, (uint32_t)v) ; }

/* One checked frame at p: returns its payload size, or -1 when it is not a
 * complete frame of this type on this channel within the limit. */
static inline Py_ssize_t frame_at(const unsigned char *d, Py_ssize_t n, Py_ssize_t p,
                                  unsigned type, unsigned channel, uint32_t limit) {
    if (n - p < 8) return -1;
    if (d[p] != type || rd16(d + p + 1) != channel) return -1;
    uint32_t size = rd32(d + p + 3);
    if (size > limit || (Py_ssize_t)size > n - p - 8) return -1;
    if (d[p + 7 + size] != 0xCE) return -1;
    return (Py_ssize_t)size;
}

typedef struct {
    Py_ssize_t names_at, names_len;   /* exchange + routing key shortstrs */
    Py_ssize_t header_at, header_len; /* the whole header frame */
    Py_ssize_t body_at;               /* first body frame */
    uint64_t body_size;
    int body_frames;
    Py_ssize_t end;                   /* just after the message */
} msg_t;

/* Parses one message at p; 0 if it is not a complete fast-path message. */
static int parse_message(const unsigned char *d, Py_ssize_t n, Py_ssize_t p,
                         unsigned channel, uint32_t limit, msg_t *m) {
    Py_ssize_t size = frame_at(d, n, p, 1, channel, limit);
    if (size < 9) return 0;
    const unsigned char *pl = d + p + 7;
    if (rd16(pl) != 60 || rd16(pl + 2) != 40) return 0;
    Py_ssize_t names = 6, rk = names + 1 + pl[names];
    if (rk >= size) return 0;
    Py_ssize_t bits = rk + 1 + pl[rk];
    if (bits + 1 != size || (pl[bits] & 3)) return 0;
    m->names_at = p + 7 + names;
    m->names_len = bits - names;
    p += 8 + size;
    size = frame_at(d, n, p, 2, channel, limit);
    if (size < 14) return 0;
    pl = d + p + 7;
    if (rd16(pl) != 60 || rd16(pl + 2) != 0) return 0;
    m->header_at = p;
    m->header_len = size + 8;
    m->body_size = rd64(pl + 4);
    p += 8 + size;
    m->body_at = p;
    m->body_frames = 0;
    uint64_t remaining = m->body_size;
    while (remaining > 0) {
        size = frame_at(d, n, p, 3, channel, limit);
        if (size <= 0 || (uint64_t)size > remaining) return 0;
        remaining -= (uint64_t)size;
        m->body_frames++;
        p += 8 + size;
    }
    m->end = p;
    return 1;
}

static PyObject *publish_to_deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "publish_to_deliver takes 6 arguments");
        return NULL;
    }
    Py_buffer buf, ctag;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long channel = PyLong_AsLong(args[2]);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[4]);
    long frame_max = PyLong_AsLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (start < 0 || channel < 0 || channel > 65535 || frame_max < 4096) {
        PyErr_SetString(PyExc_ValueError, "bad start, channel or frame_max");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[3], &ctag, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const unsigned char *d = buf.buf;
    Py_ssize_t n = buf.len;
    uint32_t limit = (uint32_t)(frame_max - 8);
    Py_ssize_t deliver_len = 4 + ctag.len + 9; /* + names */
    PyObject *out = NULL, *result = NULL;
    msg_t m;

    /* Pass 1: how far, how many, how big. */
    Py_ssize_t pos = start, count = 0, total = 0;
    while (parse_message(d, n, pos, (unsigned)channel, limit, &m)) {
        total += 8 + deliver_len + m.names_len + m.header_len;
        if (m.body_frames == 1)
            total += 8 + (Py_ssize_t)m.body_size;
        else if (m.body_size)
            total += (Py_ssize_t)m.body_size + 8 * (Py_ssize_t)((m.body_size + limit - 1) / limit);
        count++;
        pos = m.end;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) goto done;

    /* Pass 2: write. */
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t p = start;
    uint64_t tag = first_tag;
    for (Py_ssize_t i = 0; i < count; i++, tag++) {
        parse_message(d, n, p, (unsigned)channel, limit, &m);
        *o++ = 1;
        o = wr16(o, (uint16_t)channel);
        o = wr32(o, (uint32_t)(deliver_len + m.names_len));
        memcpy(o, "\x00\x3c\x00\x3c", 4); o += 4;
        memcpy(o, ctag.buf, ctag.len); o += ctag.len;
        o = wr64(o, tag);
        *o++ = 0;
        memcpy(o, d + m.names_at, m.names_len); o += m.names_len;
        *o++ = 0xCE;
        memcpy(o, d + m.header_at, m.header_len); o += m.header_len;
        if (m.body_frames == 1) {
            memcpy(o, d + m.body_at, 8 + m.body_size); o += 8 + m.body_size;
        } else if (m.body_frames > 1) {
            /* Re-join the received frames' payloads into frames of up to limit. */
            Py_ssize_t q = m.body_at, in_left = 0;
            const unsigned char *src = NULL;
            uint64_t left = m.body_size;
            while (left > 0) {
                uint32_t chunk = left > limit ? limit : (uint32_t)left;
                *o++ = 3;
                o = wr16(o, (uint16_t)channel);
                o = wr32(o, chunk);
                left -= chunk;
                while (chunk > 0) {
                    if (in_left == 0) {
                        in_left = rd32(d + q + 3);
                        src = d + q + 7;
                        q += 8 + in_left;
                    }
                    Py_ssize_t take = in_left < (Py_ssize_t)chunk ? in_left : (Py_ssize_t)chunk;
                    memcpy(o, src, take);
                    o += take; src += take; in_left -= take; chunk -= (uint32_t)take;
                }
                *o++ = 0xCE;
            }
        }
        p = m.end;
    }
    result = Py_BuildValue("(nnN)", pos, count, out);
done:
    PyBuffer_Release(&ctag);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"publish_to_deliver", (PyCFunction)(void (*)(void))publish_to_deliver, METH_FASTCALL,
     "publish_to_deliver(data, start, channel, ctag_head, first_tag, frame_max) -> (pos, count, out)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fastpath_c", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fastpath_c(void) { return PyModule_Create(&module); }
