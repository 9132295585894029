/* warren._fastpath: deliver_frames, a consumer's frames for a run's messages.
 */
#include "_fastpath.h"

/* deliver_frames(run, start, stop, step, channel, deliver_head, first_tag, frame_max) -> bytes
 *
 * What a no-ack consumer gets for messages start, start + step, ... < stop of
 * a run (step > 1: its share of a round-robin among step consumers), as one
 * bytes object: per message a basic.deliver method frame (deliver_head: class,
 * method and the consumer tag as a shortstr; then the delivery tag, counting
 * up from first_tag, redelivered 0, and the run's exchange and routing key),
 * the content header with the properties as received, and the body in frames
 * of at most frame_max - 8 octets. amqp/frames.py's message_frames, batched. */
PyObject *deliver_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "deliver_frames(run, start, stop, step, channel, "
                                         "deliver_head, first_tag, frame_max)");
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], &PublishRunType)) {
        PyErr_SetString(PyExc_TypeError, "deliver_frames: run must be a warren._fastpath.PublishRun");
        return NULL;
    }
    PublishRun *run = (PublishRun *)args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
    Py_ssize_t step = PyLong_AsSsize_t(args[3]);
    Py_ssize_t channel = PyLong_AsSsize_t(args[4]);
    unsigned long long first_tag = PyLong_AsUnsignedLongLong(args[6]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[7]);
    if (PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "deliver_frames: deliver_head must be bytes");
        return NULL;
    }
    if (start < 0 || stop > run->count || start > stop || step < 1 || channel < 0 ||
        channel > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "deliver_frames: bad range or channel");
        return NULL;
    }
    const unsigned char *head = (const unsigned char *)PyBytes_AS_STRING(args[5]);
    Py_ssize_t head_len = PyBytes_GET_SIZE(args[5]);
    const unsigned char *m = (const unsigned char *)PyBytes_AS_STRING(run->method);
    const unsigned char *ex_rk = m + 6;                      /* exchange, routing key */
    Py_ssize_t ex_rk_len = PyBytes_GET_SIZE(run->method) - 7; /* without the bits octet */
    Py_ssize_t chunk = frame_max > 8 ? frame_max - 8 : PY_SSIZE_T_MAX;
    const unsigned char *d = (const unsigned char *)run->view.buf;
    Py_ssize_t method_size = head_len + 9 + ex_rk_len;

    /* Sizes first: one allocation. */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = start; i < stop; i += step) {
        Py_ssize_t *s = run->spans + 4 * i;
        Py_ssize_t body = s[3] - s[2];
        total += 8 + method_size + 8 + 12 + (s[1] - s[0]);
        if (body) total += body + 8 * ((body - 1) / chunk + 1);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    uint64_t tag = first_tag;
    for (Py_ssize_t i = start; i < stop; i += step, tag++) {
        Py_ssize_t *s = run->spans + 4 * i;
        Py_ssize_t plen = s[1] - s[0];
        Py_ssize_t body = s[3] - s[2];
        o = put_frame_head(o, 1, (uint16_t)channel, (uint32_t)method_size);
        memcpy(o, head, (size_t)head_len);
        o += head_len;
        o = put_be64(o, tag);
        *o++ = 0; /* redelivered */
        memcpy(o, ex_rk, (size_t)ex_rk_len);
        o += ex_rk_len;
        *o++ = 0xCE;
        o = put_frame_head(o, 2, (uint16_t)channel, (uint32_t)(12 + plen));
        *o++ = 0; *o++ = 60; *o++ = 0; *o++ = 0; /* class 60, weight 0 */
        o = put_be64(o, (uint64_t)body);
        memcpy(o, d + s[0], (size_t)plen);
        o += plen;
        *o++ = 0xCE;
        for (Py_ssize_t at = 0; at < body; at += chunk) {
            Py_ssize_t part = body - at < chunk ? body - at : chunk;
            o = put_frame_head(o, 3, (uint16_t)channel, (uint32_t)part);
            memcpy(o, d + s[2] + at, (size_t)part);
            o += part;
            *o++ = 0xCE;
        }
    }
    if (o != (unsigned char *)PyBytes_AS_STRING(out) + total) { /* sizes and writes disagree */
        Py_DECREF(out);
        PyErr_SetString(PyExc_SystemError, "deliver_frames: size mismatch");
        return NULL;
    }
    return out;
}
