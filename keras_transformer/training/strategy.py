"""Several devices for training: tf.distribute strategies on TensorFlow (which one a config
asks for, which worker is chief), Keras' DataParallel distribution on JAX."""

import os

import keras

from keras_transformer.errors import ConfigError

TENSORFLOW_ONLY = {"mirrored": "on JAX every local device is used by default "
                               "(keras.distribution.DataParallel): drop --strategy",
                   "multiworker": "multi-host training runs under TensorFlow only: set "
                                  "KERAS_BACKEND=tensorflow"}


class OneDevice:
    """What training needs to know of a strategy when there is none to make (JAX: Keras'
    distribution does the splitting; one input pipeline, one chief)."""

    num_replicas_in_sync = 1
    cluster_resolver = None

    def scope(self):
        import contextlib

        return contextlib.nullcontext()


def make_strategy(strategy="default", num_replicas=2):
    """`default`, `mirrored` (local GPUs, else `num_replicas` logical CPUs), `multiworker`
    (TensorFlow). On JAX, `default` spreads each batch over every local device with
    `keras.distribution.DataParallel`; the TensorFlow strategies are refused by name."""
    if keras.backend.backend() != "tensorflow":
        if strategy in TENSORFLOW_ONLY:
            raise ConfigError(f"--strategy {strategy} is a TensorFlow strategy; "
                              f"{TENSORFLOW_ONLY[strategy]}.")
        devices = keras.distribution.list_devices()
        if len(devices) > 1:
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        return OneDevice()
    import tensorflow as tf

    if strategy == "default":
        return tf.distribute.get_strategy()
    if strategy == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise ConfigError("strategy 'multiworker' needs TF_CONFIG (cluster and task) in "
                              "the environment of every worker.")
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy()
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_replicas
        )
    except RuntimeError:
        pass  # already configured (or TensorFlow already started): use what exists
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:num_replicas]
    return tf.distribute.MirroredStrategy(devices)


def is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker"
                                             and resolver.task_id == 0)


def task_id(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver.task_id if resolver is not None else 0


def local_devices():
    """Devices one batch is split over by Keras' distribution (JAX), else 1."""
    distribution = keras.distribution.distribution() if keras.backend.backend() == "jax" else None
    return len(distribution.device_mesh.devices.flatten()) if distribution is not None else 1


def input_pipelines(strategy):
    """How many input pipelines `distribute_datasets_from_function` makes: one per worker."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return 1
    spec = resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs)
