/* warren._syncworker: the group commit's fdatasync calls, off the GIL.
 *
 * sync_files(fds, paths, directories) is store/sync_files.py's sync_files in
 * one call that releases the GIL once (the Python version releases and takes
 * it back around every open, fdatasync and close).
 *
 * SyncWorker is store/sync.py's worker thread in C: a POSIX thread that never
 * touches Python. A round's descriptors, paths and directories are copied in
 * with submit(); the thread syncs them and writes one byte to a pipe, which
 * the event loop watches (add_reader on fileno()), and collect() hands back
 * the finished rounds. A Python worker thread has to take the GIL back after
 * its fdatasync, and behind a busy event loop that wait was a third of a
 * round; here the loop only wakes up on the pipe.
 *
 * setup.py builds this module next to _fastpath when a C compiler is there;
 * without it store/sync.py runs its rounds on a ThreadPoolExecutor.
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sync_file_range */
#endif
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#ifdef __APPLE__
#define fdatasync fsync /* macOS has no fdatasync */
#endif

/* -- one sync: descriptors, then files by path, then directories ---------------------- */

typedef struct {
    int *fds;
    Py_ssize_t nfds;
    char **paths; /* fdatasync through a fresh descriptor; gone meanwhile: skipped */
    Py_ssize_t npaths;
    char **dirs; /* fsync; gone meanwhile: skipped */
    Py_ssize_t ndirs;
    int err;            /* 0, or the first failure's errno */
    const char *failed; /* the path or directory that failed, or NULL (a descriptor) */
} Files;

static void files_free(Files *f) {
    if (f->fds != NULL)
        for (Py_ssize_t i = 0; i < f->nfds; i++) close(f->fds[i]);
    if (f->paths != NULL) {
        for (Py_ssize_t i = 0; i < f->npaths; i++) PyMem_RawFree(f->paths[i]);
        PyMem_RawFree(f->paths);
    }
    if (f->dirs != NULL) {
        for (Py_ssize_t i = 0; i < f->ndirs; i++) PyMem_RawFree(f->dirs[i]);
        PyMem_RawFree(f->dirs);
    }
    PyMem_RawFree(f->fds);
    memset(f, 0, sizeof(*f));
}

static char **copy_bytes_list(PyObject *list, Py_ssize_t *count, const char *what) {
    if (!PyList_Check(list)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", what);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    char **out = PyMem_RawCalloc((size_t)n + 1, sizeof(char *));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(list, i);
        if (!PyBytes_Check(p)) {
            PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", what);
            goto fail;
        }
        size_t len = (size_t)PyBytes_GET_SIZE(p);
        out[i] = PyMem_RawMalloc(len + 1);
        if (out[i] == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(out[i], PyBytes_AS_STRING(p), len + 1);
    }
    *count = n;
    return out;
fail:
    for (Py_ssize_t i = 0; i < n; i++) PyMem_RawFree(out[i]);
    PyMem_RawFree(out);
    return NULL;
}

/* Copy the arguments (with the GIL). The descriptors are owned from here on:
 * closed by files_free even when a later argument is refused. */
static int files_from(Files *f, PyObject *fds, PyObject *paths, PyObject *dirs) {
    memset(f, 0, sizeof(*f));
    if (!PyList_Check(fds)) {
        PyErr_SetString(PyExc_TypeError, "fds must be a list of int");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(fds);
    f->fds = PyMem_RawMalloc(sizeof(int) * ((size_t)n + 1));
    if (f->fds == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PyList_GET_ITEM(fds, i));
        if (fd == -1 && PyErr_Occurred()) return -1; /* those before it close in files_free */
        f->fds[f->nfds++] = (int)fd;
    }
    f->paths = copy_bytes_list(paths, &f->npaths, "paths");
    if (f->paths == NULL) return -1;
    f->dirs = copy_bytes_list(dirs, &f->ndirs, "directories");
    if (f->dirs == NULL) return -1;
    return 0;
}

static int sync_path(const char *path, int flags, int (*sync)(int)) {
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : errno;
    int err = sync(fd) != 0 ? errno : 0;
    close(fd);
    return err;
}

/* Without the GIL: sync everything (stopping at the first failure), close the
 * descriptors whatever happens. */
static void files_sync(Files *f) {
    int err = 0;
#ifdef SYNC_FILE_RANGE_WRITE
    /* Start the writeback of every file before waiting on any: the first
     * fdatasync's journal commit then covers the others' new sizes too, and
     * theirs find nothing left to commit (one ext4 commit per round instead of
     * one per file: bench/write_amplification.py). Only a hint; the fdatasync
     * calls below are what the round promises. */
    if (f->nfds > 1)
        for (Py_ssize_t i = 0; i < f->nfds; i++)
            (void)sync_file_range(f->fds[i], 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
    for (Py_ssize_t i = 0; i < f->nfds && !err; i++)
        if (fdatasync(f->fds[i]) != 0) err = errno;
    for (Py_ssize_t i = 0; i < f->npaths && !err; i++)
        if ((err = sync_path(f->paths[i], O_RDONLY, fdatasync)) != 0) f->failed = f->paths[i];
    for (Py_ssize_t i = 0; i < f->ndirs && !err; i++)
        if ((err = sync_path(f->dirs[i], O_RDONLY | O_DIRECTORY, fsync)) != 0) f->failed = f->dirs[i];
    for (Py_ssize_t i = 0; i < f->nfds; i++) close(f->fds[i]);
    f->nfds = 0;
    f->err = err;
}

static PyObject *files_error(const Files *f) {
    errno = f->err;
    if (f->failed != NULL) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, f->failed);
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* sync_files(fds, paths, directories) -> None: fdatasync each descriptor
 * (closing it), then each file by path, then fsync each directory; the first
 * failure raises OSError. paths and directories are bytes (os.fsencode). */
static PyObject *sync_files(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "sync_files(fds: list[int], paths: list[bytes], "
                                         "directories: list[bytes])");
        return NULL;
    }
    Files f;
    if (files_from(&f, args[0], args[1], args[2]) < 0) {
        files_free(&f);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    files_sync(&f);
    Py_END_ALLOW_THREADS
    PyObject *result = f.err ? files_error(&f) : Py_NewRef(Py_None);
    files_free(&f);
    return result;
}

/* -- SyncWorker ------------------------------------------------------------------------- */

typedef struct Job {
    struct Job *next;
    long long id;
    Files files;
} Job;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int inited;    /* mu and cv are initialised */
    int started;   /* the thread runs (it starts with the first submit) */
    int stopping;  /* close(): the thread finishes the queued jobs and ends */
    int pipe_r, pipe_w;
    Job *todo, *todo_tail; /* submitted, in order */
    Job *done, *done_tail; /* synced, waiting for collect() */
} SyncWorker;

static void *worker_main(void *arg) {
    SyncWorker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->todo == NULL && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        Job *job = w->todo;
        if (job == NULL) break; /* stopping, nothing left */
        w->todo = job->next;
        if (w->todo == NULL) w->todo_tail = NULL;
        pthread_mutex_unlock(&w->mu);
        files_sync(&job->files);
        job->next = NULL;
        pthread_mutex_lock(&w->mu);
        if (w->done_tail != NULL)
            w->done_tail->next = job;
        else
            w->done = job;
        w->done_tail = job;
        pthread_mutex_unlock(&w->mu);
        /* A full pipe already wakes the reader, which takes every finished job. */
        char one = 1;
        ssize_t ignored = write(w->pipe_w, &one, 1);
        (void)ignored;
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int set_flags(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    int fdfl = fcntl(fd, F_GETFD);
    return fdfl < 0 || fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) < 0 ? -1 : 0;
}

static PyObject *worker_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "SyncWorker() takes no arguments");
        return NULL;
    }
    SyncWorker *w = (SyncWorker *)type->tp_alloc(type, 0);
    if (w == NULL) return NULL;
    w->pipe_r = w->pipe_w = -1;
    int p[2];
    if (pipe(p) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(w);
        return NULL;
    }
    w->pipe_r = p[0];
    w->pipe_w = p[1];
    if (set_flags(p[0]) < 0 || set_flags(p[1]) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->inited = 1;
    return (PyObject *)w;
}

/* Stop the thread after the queued jobs (without the GIL while joining). */
static void worker_stop(SyncWorker *w) {
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(w->thread, NULL);
    Py_END_ALLOW_THREADS
    w->started = 0;
}

static void free_jobs(Job *job) {
    while (job != NULL) {
        Job *next = job->next;
        files_free(&job->files);
        PyMem_RawFree(job);
        job = next;
    }
}

static void worker_dealloc(SyncWorker *w) {
    worker_stop(w);
    free_jobs(w->todo);
    free_jobs(w->done);
    w->todo = w->done = NULL;
    if (w->pipe_r >= 0) close(w->pipe_r);
    if (w->pipe_w >= 0) close(w->pipe_w);
    if (w->inited) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* submit(job_id, fds, paths, directories) -> None */
static PyObject *worker_submit(SyncWorker *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "submit(job_id: int, fds: list[int], paths: list[bytes], "
                        "directories: list[bytes])");
        return NULL;
    }
    long long id = PyLong_AsLongLong(args[0]);
    if (id == -1 && PyErr_Occurred()) return NULL;
    Job *job = PyMem_RawCalloc(1, sizeof(Job));
    if (job == NULL) return PyErr_NoMemory();
    job->id = id;
    if (files_from(&job->files, args[1], args[2], args[3]) < 0) {
        free_jobs(job);
        return NULL;
    }
    if (w->stopping) {
        free_jobs(job);
        PyErr_SetString(PyExc_RuntimeError, "SyncWorker is closed");
        return NULL;
    }
    if (!w->started) {
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            free_jobs(job);
            errno = rc;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        w->started = 1;
    }
    pthread_mutex_lock(&w->mu);
    if (w->todo_tail != NULL)
        w->todo_tail->next = job;
    else
        w->todo = job;
    w->todo_tail = job;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    Py_RETURN_NONE;
}

/* collect() -> [(job_id, None | OSError), ...]: the finished jobs, in order. */
static PyObject *worker_collect(SyncWorker *w, PyObject *unused) {
    char buf[256];
    while (read(w->pipe_r, buf, sizeof(buf)) > 0) {
    }
    pthread_mutex_lock(&w->mu);
    Job *jobs = w->done;
    w->done = w->done_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    PyObject *out = PyList_New(0);
    for (Job *job = jobs; job != NULL && out != NULL; job = job->next) {
        PyObject *error = Py_None;
        if (job->files.err) {
            /* The exception object itself, as concurrent.futures would hand it. */
            PyObject *type, *value, *tb;
            files_error(&job->files);
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            error = value;
        } else {
            Py_INCREF(error);
        }
        PyObject *item = error == NULL ? NULL : Py_BuildValue("(LN)", job->id, error);
        if (item == NULL || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    free_jobs(jobs);
    return out;
}

static PyObject *worker_fileno(SyncWorker *w, PyObject *unused) {
    return PyLong_FromLong(w->pipe_r);
}

static PyObject *worker_close(SyncWorker *w, PyObject *unused) {
    if (!w->started) w->stopping = 1; /* else worker_stop sets it, under the lock */
    worker_stop(w);
    /* The pipe goes now, not when the object is collected (a broker's cycles may
     * keep it for long: every broker in a test process would hold two more fds). */
    if (w->pipe_r >= 0) close(w->pipe_r);
    if (w->pipe_w >= 0) close(w->pipe_w);
    w->pipe_r = w->pipe_w = -1;
    Py_RETURN_NONE;
}

static PyMethodDef worker_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))worker_submit, METH_FASTCALL,
     "submit(job_id, fds, paths, directories): sync them on the thread (the descriptors "
     "are closed there)"},
    {"collect", (PyCFunction)worker_collect, METH_NOARGS,
     "collect() -> [(job_id, None or OSError)]: the jobs finished since the last call"},
    {"fileno", (PyCFunction)worker_fileno, METH_NOARGS,
     "fileno() -> int: readable when a job has finished"},
    {"close", (PyCFunction)worker_close, METH_NOARGS,
     "close(): finish the submitted jobs, stop the thread, close the pipe (collect() still "
     "returns what finished)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SyncWorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "warren._syncworker.SyncWorker",
    .tp_basicsize = sizeof(SyncWorker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The group commit's sync thread, without the GIL (see the module docstring).",
    .tp_new = worker_new,
    .tp_dealloc = (destructor)worker_dealloc,
    .tp_methods = worker_methods,
};

static PyMethodDef module_methods[] = {
    {"sync_files", (PyCFunction)(void (*)(void))sync_files, METH_FASTCALL,
     "sync_files(fds, paths, directories) -> None: fdatasync without the GIL"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "warren._syncworker",
    "The group commit's fdatasync calls without the GIL (see store/sync.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__syncworker(void) {
    if (PyType_Ready(&SyncWorkerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&SyncWorkerType);
    if (PyModule_AddObject(m, "SyncWorker", (PyObject *)&SyncWorkerType) < 0) {
        Py_DECREF(&SyncWorkerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
