/* memfit.data.sources.cresize: the image packer's resize, in C, without the GIL.
 *
 * Pillow decodes an RGB image into its own memory, four bytes a pixel (RGBX). From
 * Python, getting at it costs a copy (np.asarray(image) is image.tobytes(): the pixels
 * packed to three bytes in 64 KiB pieces, then joined), made with the GIL held, and then
 * NumPy's resize is a dozen calls that take the GIL again: on two decode threads the
 * pack used 1.6 of its 2 cores. Pillow (>= 11.2) exports the same memory through the
 * Arrow C data interface (image.__arrow_c_array__(): a fixed_size_list<uint8>[4] a
 * pixel, no copy); resize_rgbx reads the four neighbours of each output pixel straight
 * from it and writes the uint8 result into the caller's buffer, with the GIL released.
 *
 * The arithmetic is memfit.data.sources.image_source.resize_bilinear's, operation for
 * operation in float32 (tf.image.resize's bilinear, half-pixel centres), then rounded
 * half to even and clipped as np.rint and np.clip do: the bytes are the NumPy path's,
 * which the tests check. setup.py compiles it with -ffp-contract=off so that no
 * multiply-add is fused (a fused one rounds once, not twice).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The Arrow C data interface (https://arrow.apache.org/docs/format/CDataInterface.html):
 * an ABI that does not change. */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* The RGBX pixels of an exported image, or NULL with a ValueError. */
static const uint8_t *
rgbx_pixels(PyObject *schema_capsule, PyObject *array_capsule, int64_t pixels)
{
    struct ArrowSchema *schema = PyCapsule_GetPointer(schema_capsule, "arrow_schema");
    if (schema == NULL)
        return NULL;
    struct ArrowArray *array = PyCapsule_GetPointer(array_capsule, "arrow_array");
    if (array == NULL)
        return NULL;
    if (schema->release == NULL || array->release == NULL || schema->format == NULL
        || strcmp(schema->format, "+w:4") != 0 || schema->n_children != 1
        || schema->children[0]->format == NULL || strcmp(schema->children[0]->format, "C") != 0
        || array->n_children != 1 || array->offset != 0 || array->length != pixels
        || array->null_count != 0) {
        PyErr_SetString(PyExc_ValueError, "not an RGB image of the expected size exported as "
                        "fixed_size_list<uint8>[4]");
        return NULL;
    }
    struct ArrowArray *child = array->children[0];
    if (child->n_buffers != 2 || child->offset != 0 || child->length != 4 * pixels
        || child->null_count != 0 || child->buffers[1] == NULL) {
        PyErr_SetString(PyExc_ValueError, "the image's pixels are not one uint8 buffer");
        return NULL;
    }
    return (const uint8_t *)child->buffers[1];
}

static int
buffer_of(PyObject *obj, Py_buffer *view, Py_ssize_t bytes, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len != bytes) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, expected %zd", what, view->len,
                     bytes);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* resize_rgbx(schema, array, height, width, top, left, y0, y1, wy, x0, x1, wx, out)
 *
 * schema, array: image.__arrow_c_array__() of an RGB image of height x width pixels.
 * top, left: where the crop starts; y0, y1 (intp) and wy (float32): each output row's
 * two source rows in the crop and the second's weight; x0, x1, wx: the same for columns.
 * out: a writable C-contiguous uint8 buffer of len(wy) x len(wx) x 3 bytes. */
static PyObject *
resize_rgbx(PyObject *self, PyObject *args)
{
    PyObject *schema, *array, *oy0, *oy1, *owy, *ox0, *ox1, *owx, *oout;
    Py_ssize_t height, width, top, left;
    if (!PyArg_ParseTuple(args, "OOnnnnOOOOOOO", &schema, &array, &height, &width, &top, &left,
                          &oy0, &oy1, &owy, &ox0, &ox1, &owx, &oout))
        return NULL;
    if (height < 1 || width < 1 || top < 0 || left < 0 || top >= height || left >= width) {
        PyErr_Format(PyExc_ValueError, "bad image geometry: %zd x %zd from (%zd, %zd)",
                     height, width, top, left);
        return NULL;
    }
    const uint8_t *pixels = rgbx_pixels(schema, array, (int64_t)height * width);
    if (pixels == NULL)
        return NULL;
    Py_buffer wy, wx, y0, y1, x0, x1, out;
    if (PyObject_GetBuffer(owy, &wy, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(owx, &wx, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&wy);
        return NULL;
    }
    Py_ssize_t oh = wy.len / (Py_ssize_t)sizeof(float), ow = wx.len / (Py_ssize_t)sizeof(float);
    int ok = oh > 0 && ow > 0 && wy.len % sizeof(float) == 0 && wx.len % sizeof(float) == 0;
    int got = 0;
    if (ok && buffer_of(oy0, &y0, oh * sizeof(Py_ssize_t), 0, "y0") == 0) {
        got = 1;
        if (buffer_of(oy1, &y1, oh * sizeof(Py_ssize_t), 0, "y1") == 0) {
            got = 2;
            if (buffer_of(ox0, &x0, ow * sizeof(Py_ssize_t), 0, "x0") == 0) {
                got = 3;
                if (buffer_of(ox1, &x1, ow * sizeof(Py_ssize_t), 0, "x1") == 0) {
                    got = 4;
                    if (buffer_of(oout, &out, oh * ow * 3, 1, "out") == 0)
                        got = 5;
                }
            }
        }
    } else if (!ok) {
        PyErr_SetString(PyExc_ValueError, "wy and wx must be non-empty float32 arrays");
    }
    if (got == 5) {
        const Py_ssize_t *ry0 = y0.buf, *ry1 = y1.buf, *cx0 = x0.buf, *cx1 = x1.buf;
        const float *fy = wy.buf, *fx = wx.buf;
        for (Py_ssize_t i = 0; i < oh && ok; i++)
            ok = ry0[i] >= 0 && ry1[i] >= 0 && top + ry0[i] < height && top + ry1[i] < height;
        for (Py_ssize_t j = 0; j < ow && ok; j++)
            ok = cx0[j] >= 0 && cx1[j] >= 0 && left + cx0[j] < width && left + cx1[j] < width;
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "a source index is outside the image");
        } else {
            uint8_t *dst = out.buf;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < oh; i++) {
                const uint8_t *r0 = pixels + ((top + ry0[i]) * width + left) * 4;
                const uint8_t *r1 = pixels + ((top + ry1[i]) * width + left) * 4;
                float v = fy[i];
                for (Py_ssize_t j = 0; j < ow; j++) {
                    const uint8_t *p00 = r0 + cx0[j] * 4, *p01 = r0 + cx1[j] * 4;
                    const uint8_t *p10 = r1 + cx0[j] * 4, *p11 = r1 + cx1[j] * 4;
                    float u = fx[j];
                    for (int c = 0; c < 3; c++) {
                        float a = p00[c], b = p01[c], cc = p10[c], d = p11[c];
                        float t = b - a;
                        t = t * u;
                        float topv = a + t;
                        float s = d - cc;
                        s = s * u;
                        float bottom = cc + s;
                        float r = bottom - topv;
                        r = r * v;
                        r = topv + r;
                        r = nearbyintf(r);
                        r = r < 0.0f ? 0.0f : (r > 255.0f ? 255.0f : r);
                        *dst++ = (uint8_t)r;
                    }
                }
            }
            Py_END_ALLOW_THREADS
        }
    }
    if (got >= 5) PyBuffer_Release(&out);
    if (got >= 4) PyBuffer_Release(&x1);
    if (got >= 3) PyBuffer_Release(&x0);
    if (got >= 2) PyBuffer_Release(&y1);
    if (got >= 1) PyBuffer_Release(&y0);
    PyBuffer_Release(&wx);
    PyBuffer_Release(&wy);
    if (got < 5 || !ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"resize_rgbx", resize_rgbx, METH_VARARGS,
     "resize_rgbx(schema, array, height, width, top, left, y0, y1, wy, x0, x1, wx, out): "
     "the bilinear resize of an RGB image Pillow exported through the Arrow C data "
     "interface, into out (uint8), without the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cresize",
    "The image packer's resize from Pillow's own memory, without the GIL.", -1, methods,
};

PyMODINIT_FUNC
PyInit_cresize(void)
{
    return PyModule_Create(&module);
}
