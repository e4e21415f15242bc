"""tf.distribute for training: which strategy a config asks for, and which worker is chief."""

import os

import tensorflow as tf

from keras_transformer.errors import ConfigError


def make_strategy(strategy="default", num_replicas=2):
    """`default`, `mirrored` (local GPUs, else `num_replicas` logical CPUs), `multiworker`."""
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


def input_pipelines(strategy):
    """How many input pipelines `distribute_datasets_from_function` makes: one per worker."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return 1
    spec = resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs)
