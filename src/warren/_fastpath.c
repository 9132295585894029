/* warren._fastpath: the hot path's byte work in C.
 *
 * scan_publishes() is warren/amqp/publish_run.py's scan_publishes without a
 * Python object per message: it walks the frames of one socket read and
 * records, in a C array inside one PublishRun object, where each message's
 * property list and body lie. publish_run.py is the reference (and the
 * fallback without a compiler); tests/test_publish_run.py checks both alike.
 *
 * deliver_frames() writes what a consumer gets for a run's messages
 * (amqp/consumer.py's AMQPConsumer.deliver_run and deliver_stored_run),
 * straight from the publisher's bytes; amqp/frames.py's message_frames is its
 * reference.
 *
 * encode_records() writes the segment-store records of a run's messages (for
 * an acknowledging consumer, stored before they are delivered), with their
 * CRC-32; store/records.py's encode_run is its reference.
 *
 * setup.py builds this module when a C compiler is there; when it cannot,
 * Warren runs publish_run.py instead. WARREN_PURE_PYTHON=1 makes Warren ignore
 * it (publish_run.py decides).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *plain_props[3]; /* b"\x00\x00", b"\x10\x00\x01", b"\x10\x00\x02" */

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
static int plain_index(const unsigned char *p, Py_ssize_t len) {
    if (len == 2 && p[0] == 0 && p[1] == 0) return 0;
    if (len == 3 && p[0] == 0x10 && p[1] == 0 && (p[2] == 1 || p[2] == 2)) return p[2];
    return -1;
}

/* The property flags a run may carry beyond delivery-mode: content-type,
 * content-encoding, priority, correlation-id (first byte), message-id,
 * timestamp, type, app-id (second byte). Not headers (a table: CC/BCC, the
 * headers exchange), reply-to (direct reply-to's rewrite), expiration (TTL),
 * user-id (checked against the login), cluster-id, a continued flag word. */
#define SIMPLE_FLAGS_0 (0x80 | 0x40 | 0x10 | 0x08 | 0x04)
#define SIMPLE_FLAGS_1 (0x80 | 0x40 | 0x20 | 0x08)
#define MAX_TIMESTAMP 253402300799ull /* the year 9999, as core/table.py */

/* Whether p[0:len] is a property list made only of those, well formed and
 * what channel.py's checks would pass without a word (ASCII short strings,
 * delivery-mode 1 or 2, a timestamp before the year 10000); *mode gets its
 * delivery-mode (0: none). Anything else goes the slow way. */
static int simple_props(const unsigned char *p, Py_ssize_t len, int *mode) {
    *mode = 0;
    if (len < 2 || (p[0] & ~SIMPLE_FLAGS_0) || (p[1] & ~SIMPLE_FLAGS_1)) return 0;
    unsigned flags = (unsigned)p[0] << 8 | p[1];
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

static PyTypeObject PublishRunType;

static PyObject *scan_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

static void run_dealloc(PublishRun *run) {
    PyBuffer_Release(&run->view);
    Py_XDECREF(run->method);
    PyMem_Free(run->spans);
    PyMem_Free(run->methods);
    PyObject_Free(run);
}

/* A run of the messages idx[0..k-1] of a keyed run, which all share the method
 * payload `method` (a new reference is taken): the same bytes, its own spans. */
static PyObject *sub_run(PublishRun *run, PyObject *method, const Py_ssize_t *idx, Py_ssize_t k) {
    PublishRun *sub = PyObject_New(PublishRun, &PublishRunType);
    if (sub == NULL) return NULL;
    sub->spans = PyMem_Malloc((size_t)k * 4 * sizeof(Py_ssize_t));
    sub->methods = NULL;
    sub->method = NULL;
    if (sub->spans == NULL || PyObject_GetBuffer(run->view.obj, &sub->view, PyBUF_SIMPLE) < 0) {
        PyMem_Free(sub->spans);
        PyObject_Free(sub);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t j = 0; j < k; j++)
        memcpy(sub->spans + 4 * j, run->spans + 4 * idx[j], 4 * sizeof(Py_ssize_t));
    Py_INCREF(method);
    sub->method = method;
    sub->channel = run->channel;
    sub->end = run->end;
    sub->count = k;
    return (PyObject *)sub;
}

/* run.groups(ordered) -> [(run, indexes)]: a keyed run's messages as plain runs
 * of one routing key each, with their indexes in this run. ordered: only
 * consecutive messages group (publish order kept across keys); otherwise all
 * of a key's messages, in order, whatever lies between them. */
static PyObject *run_groups(PublishRun *run, PyObject *arg) {
    int ordered = PyObject_IsTrue(arg);
    if (ordered < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t n = run->count;
    if (run->methods == NULL) { /* uniform: itself, all of it */
        PyObject *indexes = PyList_New(n);
        if (indexes == NULL) goto fail;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyLong_FromSsize_t(i);
            if (v == NULL) {
                Py_DECREF(indexes);
                goto fail;
            }
            PyList_SET_ITEM(indexes, i, v);
        }
        PyObject *pair = Py_BuildValue("(ON)", (PyObject *)run, indexes);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            goto fail;
        }
        Py_DECREF(pair);
        return out;
    }
    /* Each message's method payload -> the indexes that have it, first seen first
     * (ordered: a new group whenever the payload changes). */
    const unsigned char *d = (const unsigned char *)run->view.buf;
    PyObject *keys = PyDict_New();  /* payload -> position in `order` (unordered only) */
    PyObject *order = PyList_New(0); /* [payload, [indexes]] */
    Py_ssize_t *idx = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    if (keys == NULL || order == NULL || idx == NULL) {
        if (idx == NULL) PyErr_NoMemory();
        goto fail_groups;
    }
    PyObject *last = NULL; /* ordered: the current group's [payload, indexes] */
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *mi = d + run->methods[2 * i];
        Py_ssize_t li = run->methods[2 * i + 1];
        PyObject *group = NULL;
        if (ordered) {
            if (last != NULL) {
                PyObject *lm = PyList_GET_ITEM(last, 0);
                if (PyBytes_GET_SIZE(lm) == li && memcmp(PyBytes_AS_STRING(lm), mi, (size_t)li) == 0)
                    group = last;
            }
        }
        PyObject *method = NULL;
        if (group == NULL) {
            method = PyBytes_FromStringAndSize((const char *)mi, li);
            if (method == NULL) goto fail_groups;
            if (!ordered) group = PyDict_GetItemWithError(keys, method);
            if (group == NULL && PyErr_Occurred()) {
                Py_DECREF(method);
                goto fail_groups;
            }
        }
        if (group == NULL) {
            group = Py_BuildValue("[O[]]", method);
            if (group == NULL || PyList_Append(order, group) < 0 ||
                (!ordered && PyDict_SetItem(keys, method, group) < 0)) {
                Py_XDECREF(group);
                Py_DECREF(method);
                goto fail_groups;
            }
            Py_DECREF(group); /* order (and keys) hold it */
            last = group;
        }
        Py_XDECREF(method);
        PyObject *v = PyLong_FromSsize_t(i);
        if (v == NULL || PyList_Append(PyList_GET_ITEM(group, 1), v) < 0) {
            Py_XDECREF(v);
            goto fail_groups;
        }
        Py_DECREF(v);
    }
    for (Py_ssize_t g = 0; g < PyList_GET_SIZE(order); g++) {
        PyObject *group = PyList_GET_ITEM(order, g);
        PyObject *indexes = PyList_GET_ITEM(group, 1);
        Py_ssize_t k = PyList_GET_SIZE(indexes);
        for (Py_ssize_t j = 0; j < k; j++) idx[j] = PyLong_AsSsize_t(PyList_GET_ITEM(indexes, j));
        PyObject *sub = sub_run(run, PyList_GET_ITEM(group, 0), idx, k);
        if (sub == NULL) goto fail_groups;
        PyObject *pair = PyTuple_Pack(2, sub, indexes);
        Py_DECREF(sub);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            goto fail_groups;
        }
        Py_DECREF(pair);
    }
    Py_DECREF(keys);
    Py_DECREF(order);
    PyMem_Free(idx);
    return out;

fail_groups:
    Py_XDECREF(keys);
    Py_XDECREF(order);
    PyMem_Free(idx);
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *run_get_uniform(PublishRun *run, void *closure) {
    return PyBool_FromLong(run->methods == NULL);
}

static Py_ssize_t run_len(PublishRun *run) { return run->count; }

static int index_ok(PublishRun *run, PyObject *arg, Py_ssize_t *i) {
    *i = PyLong_AsSsize_t(arg);
    if (*i == -1 && PyErr_Occurred()) return 0;
    if (*i < 0 || *i >= run->count) {
        PyErr_SetString(PyExc_IndexError, "message index out of range");
        return 0;
    }
    return 1;
}

static PyObject *run_properties(PublishRun *run, PyObject *arg) {
    Py_ssize_t i;
    if (!index_ok(run, arg, &i)) return NULL;
    const unsigned char *p = (const unsigned char *)run->view.buf + run->spans[4 * i];
    Py_ssize_t len = run->spans[4 * i + 1] - run->spans[4 * i];
    int k = plain_index(p, len);
    if (k < 0) return PyBytes_FromStringAndSize((const char *)p, len);
    PyObject *props = plain_props[k]; /* the common lists: shared objects */
    Py_INCREF(props);
    return props;
}

static PyObject *run_body(PublishRun *run, PyObject *arg) {
    Py_ssize_t i;
    if (!index_ok(run, arg, &i)) return NULL;
    const char *b = (const char *)run->view.buf + run->spans[4 * i + 2];
    return PyBytes_FromStringAndSize(b, run->spans[4 * i + 3] - run->spans[4 * i + 2]);
}

static PyObject *run_body_size(PublishRun *run, PyObject *arg) {
    Py_ssize_t i;
    if (!index_ok(run, arg, &i)) return NULL;
    return PyLong_FromSsize_t(run->spans[4 * i + 3] - run->spans[4 * i + 2]);
}

static PyObject *run_get_data(PublishRun *run, void *closure) {
    PyObject *obj = run->view.obj;
    Py_INCREF(obj);
    return obj;
}
static PyObject *run_get_method(PublishRun *run, void *closure) {
    Py_INCREF(run->method);
    return run->method;
}
static PyObject *run_get_channel(PublishRun *run, void *closure) {
    return PyLong_FromSsize_t(run->channel);
}
static PyObject *run_get_end(PublishRun *run, void *closure) { return PyLong_FromSsize_t(run->end); }

static PyMethodDef run_methods[] = {
    {"properties", (PyCFunction)run_properties, METH_O, "message i's property list (bytes)"},
    {"body", (PyCFunction)run_body, METH_O, "message i's body (bytes)"},
    {"body_size", (PyCFunction)run_body_size, METH_O, "message i's body size"},
    {"groups", (PyCFunction)run_groups, METH_O,
     "groups(ordered) -> [(run, indexes)]: a keyed run as plain runs of one routing key"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef run_getset[] = {
    {"data", (getter)run_get_data, NULL, "the scanned bytes", NULL},
    {"method", (getter)run_get_method, NULL, "the shared basic.publish payload", NULL},
    {"channel", (getter)run_get_channel, NULL, "the channel number", NULL},
    {"end", (getter)run_get_end, NULL, "offset just past the run", NULL},
    {"uniform", (getter)run_get_uniform, NULL, "whether every message has the run's method", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods run_as_sequence = {.sq_length = (lenfunc)run_len};

static PyTypeObject PublishRunType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "warren._fastpath.PublishRun",
    .tp_basicsize = sizeof(PublishRun),
    .tp_dealloc = (destructor)run_dealloc,
    .tp_as_sequence = &run_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Complete, alike basic.publish messages of one socket read (see publish_run.py).",
    .tp_methods = run_methods,
    .tp_getset = run_getset,
};

/* deliver_frames(run, start, stop, step, channel, deliver_head, first_tag, frame_max) -> bytes
 *
 * What a no-ack consumer gets for messages start, start + step, ... < stop of
 * a run (step > 1: its share of a round-robin among step consumers), as one
 * bytes object: per message a basic.deliver method frame (deliver_head: class,
 * method and the consumer tag as a shortstr; then the delivery tag, counting
 * up from first_tag, redelivered 0, and the run's exchange and routing key),
 * the content header with the properties as received, and the body in frames
 * of at most frame_max - 8 octets. amqp/frames.py's message_frames, batched. */
static PyObject *deliver_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

/* CRC-32 as zlib.crc32 computes it (reflected, polynomial 0xEDB88320),
 * slicing by 8: the segment store's records end with one (store/records.py). */
static uint32_t crc_table[8][256];

static void crc_init(void) {
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

/* encode_records(run, start, stop, ex_rk, timestamp, base)
 *     -> (records, offsets, sizes, persistent)
 *
 * store/records.py's encode_run for a C run: the segment-store records of
 * messages start .. stop - 1, back to back in one bytes object (the format of
 * records.encode_record; ex_rk is the exchange and routing key as two
 * shortstrs). offsets: each record's position, base + where it starts in
 * records, and sizes: each body's size, both as native u32 (for
 * array("I").frombytes); persistent: how many have delivery-mode 2. */
static PyObject *encode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_records(run, start, stop, ex_rk, timestamp, base)");
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], &PublishRunType)) {
        PyErr_SetString(PyExc_TypeError, "encode_records: run must be a warren._fastpath.PublishRun");
        return NULL;
    }
    PublishRun *run = (PublishRun *)args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
    unsigned long long timestamp = PyLong_AsUnsignedLongLong(args[4]);
    unsigned long long base = PyLong_AsUnsignedLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "encode_records: ex_rk must be bytes");
        return NULL;
    }
    if (start < 0 || stop > run->count || start > stop) {
        PyErr_SetString(PyExc_ValueError, "encode_records: bad range");
        return NULL;
    }
    const unsigned char *ex_rk = (const unsigned char *)PyBytes_AS_STRING(args[3]);
    Py_ssize_t ex_rk_len = PyBytes_GET_SIZE(args[3]);
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
        o = put_be32(o, crc32_update(0, rec, o - rec));
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

/* crc32(data, value=0) -> int: zlib.crc32, for the tests of the above. */
static PyObject *fp_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

static PyMethodDef module_methods[] = {
    {"scan_publishes", (PyCFunction)(void (*)(void))scan_publishes, METH_FASTCALL,
     "scan_publishes(data, pos, frame_max, max_body, limit, keyed=False) -> PublishRun | None"},
    {"deliver_frames", (PyCFunction)(void (*)(void))deliver_frames, METH_FASTCALL,
     "deliver_frames(run, start, stop, step, channel, deliver_head, first_tag, frame_max) -> bytes"},
    {"encode_records", (PyCFunction)(void (*)(void))encode_records, METH_FASTCALL,
     "encode_records(run, start, stop, ex_rk, timestamp, base) -> (records, offsets, sizes, persistent)"},
    {"crc32", (PyCFunction)(void (*)(void))fp_crc32, METH_FASTCALL, "crc32(data, value=0) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "warren._fastpath",
    "The hot path's byte work in C (see warren/amqp/publish_run.py).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    static const char *plain[3] = {"\x00\x00", "\x10\x00\x01", "\x10\x00\x02"};
    static const Py_ssize_t plain_len[3] = {2, 3, 3};
    for (int i = 0; i < 3; i++) {
        if (plain_props[i] == NULL) {
            plain_props[i] = PyBytes_FromStringAndSize(plain[i], plain_len[i]);
            if (plain_props[i] == NULL) return NULL;
        }
    }
    crc_init();
    if (PyType_Ready(&PublishRunType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&PublishRunType);
    if (PyModule_AddObject(m, "PublishRun", (PyObject *)&PublishRunType) < 0) {
        Py_DECREF(&PublishRunType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
