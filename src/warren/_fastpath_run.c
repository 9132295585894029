/* warren._fastpath: the PublishRun type, a run's messages as spans of the bytes
 * it was scanned from: accessors, and groups() for a keyed run (amqp/publish_run.py's
 * PublishRun is the reference).
 */
#include "_fastpath.h"

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

PyTypeObject PublishRunType = {
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
