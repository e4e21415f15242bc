"""Installs keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3."""

from setuptools import find_packages, setup

# Pinned, mutually compatible versions (checked together on Python 3.11, CPU).
INSTALL_REQUIRES = [
    "tensorflow==2.21.0",
    "keras==3.15.1",
    "tensorflow-text==2.21.1",
    "tensorflow-datasets==4.9.10",
    "importlib_resources==6.5.2",  # used by tensorflow-datasets, not declared by it
    "sacrebleu==2.6.0",
    "sacremoses==0.2.0",  # the Multi30k literature's BLEU convention (Moses tokenization)
    "tensorboard==2.21.0",
    "tensorflow-serving-api==2.21.0",  # the SavedModel's warm-up records (PredictionLog)
    "sentencepiece==0.2.3",
    "numpy>=1.26,<3",
    # TensorFlow's and JAX's numpy dtypes (bfloat16, float8...). 0.7.0 registers its ufunc
    # promoters in a way that takes 1.3-1.4 s of every `import tensorflow` (numpy 2.2-2.4, 2
    # cores); 0.6.0 has the same dtypes and imports in 0.02 s (docs/performance.md).
    "ml_dtypes==0.6.0",
    "pyyaml==6.0.3",
    "tqdm==4.70.1",
    "matplotlib==3.11.2",
    "py3langid==0.4.0",  # the multilingual demo's wrong-language share (ships its model)
    # the demo's CTranslate2 int8 export; export --format ctranslate2, translate --engine
    # ctranslate2
    "ctranslate2==4.8.5",
    # `serve`: TensorFlow Serving's REST API over HTTP (an ASGI app under uvicorn, with its
    # C parser and event loop: httptools, uvloop) and its Prometheus metrics
    "starlette==1.10.0",
    "uvicorn==0.55.0",
    "httptools==0.9.0",
    "uvloop==0.23.0",
    "prometheus-client==0.26.0",
]

EXTRAS_REQUIRE = {
    # part of the normal install now; the extra stays for `pip install
    # 'keras-transformer[ctranslate2]'` written before
    "ctranslate2": ["ctranslate2==4.8.5"],
    # KERAS_BACKEND=jax: train, average, translate, evaluate without TensorFlow (CPU wheels here;
    # a GPU machine brings its own jax with CUDA)
    "jax": ["jax==0.10.2", "jaxlib==0.10.2"],
    # running the .tflite exports: LiteRT's interpreter (tf.lite.Interpreter is deprecated)
    "litert": ["ai-edge-litert==2.3.0"],
    # LiteRT's interpreter for the TFLite tests and benchmark
    "dev": ["pytest==9.2.0", "pytest-xdist==3.8.0", "coverage==7.13.5", "jax==0.10.2",
            "jaxlib==0.10.2", "ai-edge-litert==2.3.0",
            # oneTBB's malloc, which the tests preload in their processes (tests/conftest.py)
            "tbb==2023.2.0",
            # the serve tests: Starlette's TestClient (httpx2), the page driven in Debian's
            # headless Chromium (playwright, given executable_path: no browser download)
            "httpx2==2.16.2", "playwright==1.65.3"],
}

setup(
    name="keras-transformer",
    version="0.2.0",
    description="The Transformer (Vaswani et al., 2017) as Keras 3 layers, with tf.data "
    "pipelines, model.fit training, cached beam search and export.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["keras_transformer", "keras_transformer.*", "pipelines", "pipelines.*"]),
    py_modules=["keras_transformer_command"],  # the command's entry point (see its docstring)
    python_requires=">=3.10,<3.13",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={"console_scripts": ["keras-transformer=keras_transformer_command:main"]},
    license="Apache-2.0",
)
