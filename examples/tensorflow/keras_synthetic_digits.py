#!/usr/bin/env python3
"""Trains a small Keras CNN on generated 28x28 digit images: a Horovod-style Keras script on kolo.

The data needs no download: each of the ten classes is a fixed random stroke pattern, drawn at a
random offset, with a random contrast and strong pixel noise (a task a small CNN learns in a couple
of epochs). Every rank generates the same data from the seed and trains on its own shard.

What it shows (the lines Horovod asks for):
  * hvd.init(); TensorFlow threads = cores / local workers;
  * the learning rate scaled by the number of workers, reached by LearningRateWarmupCallback;
  * hvd.DistributedOptimizer around a Keras optimizer (Model.fit), or, with --custom-loop,
    hvd.DistributedGradientTape in a tf.function training step;
  * BroadcastGlobalVariablesCallback(0) (or broadcast_variables) so that every rank starts from
    rank 0's weights; MetricAverageCallback so that the printed metrics are the job's;
  * output and checkpoints from rank 0 only.

    kolorun -np 2 python3 examples/tensorflow/keras_synthetic_digits.py --epochs 3

(TensorFlow from PyPI: scripts/deps-tf.sh makes a venv with it; run its python.)
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kolo.keras as hvd  # noqa: E402  (import horovod.tensorflow.keras as hvd works the same way)
import kolo.tensorflow as hvd_tf  # noqa: E402

keras = tf.keras
KERAS_VERSION = getattr(keras, "__version__", None) or "2 (tf_keras)"

parser = argparse.ArgumentParser(description="kolo: Keras learns generated digits",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
parser.add_argument("--base-lr", type=float, default=0.05, help="learning rate of one worker")
parser.add_argument("--warmup-epochs", type=float, default=1.0)
parser.add_argument("--train-size", type=int, default=6000)
parser.add_argument("--val-size", type=int, default=1000)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--threads", type=int, default=0, help="TensorFlow threads per worker (0: cores / local workers)")
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--custom-loop", action="store_true", help="DistributedGradientTape instead of Model.fit")
parser.add_argument("--checkpoint", default="", help="rank 0 saves the model there after training (.keras)")
args = parser.parse_args()

hvd.init()
threads = args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(2)


TEMPLATES = (np.random.RandomState(args.seed).rand(10, 20, 20) < 0.18).astype(np.float32)  # a pattern per class


def make_digits(n, seed, first=0):
    """Samples first..first+n-1 of the data set named by seed (every rank draws the same)."""
    rng = np.random.RandomState(seed + 1)
    labels = rng.randint(0, 10, first + n)[first:]
    off = rng.randint(0, 5, (first + n, 2))[first:]
    contrast = rng.uniform(0.5, 1.0, first + n)[first:]
    x = np.random.RandomState(seed + 2 + first).normal(0, 0.4, (n, 28, 28)).astype(np.float32)
    for i in range(n):
        r, c = off[i]
        x[i, r:r + 20, c:c + 20] += contrast[i] * TEMPLATES[labels[i]]
    return x[..., None], labels.astype(np.int64)


per_rank = args.train_size // hvd.size()
train_x, train_y = make_digits(per_rank, args.seed, hvd.rank() * per_rank)
val_per_rank = args.val_size // hvd.size()
val_x, val_y = make_digits(val_per_rank, args.seed + 7, hvd.rank() * val_per_rank)

keras.utils.set_random_seed(args.seed + hvd.rank())  # different on purpose: the broadcast makes them equal
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(16, 5, activation="relu"),
    keras.layers.MaxPooling2D(2),
    keras.layers.Conv2D(32, 5, activation="relu"),
    keras.layers.MaxPooling2D(2),
    keras.layers.Flatten(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])
lr = args.base_lr * hvd.size()
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
steps = per_rank // args.batch_size


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


log("kolo %s: %d worker(s), %d TensorFlow thread(s) each; TensorFlow %s, Keras %s; %d images per worker, "
    "batch %d per worker, lr %.3f x %d%s" % (hvd.__version__, hvd.size(), threads, tf.__version__, KERAS_VERSION,
                                             per_rank, args.batch_size, args.base_lr, hvd.size(),
                                             " (custom loop)" if args.custom_loop else ""))


class EpochLog(keras.callbacks.Callback):
    """Prints the job's metrics (MetricAverageCallback has averaged them) once per epoch."""

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.time()

    def on_epoch_end(self, epoch, logs=None):
        log("epoch %d/%d  loss %.4f  train-acc %.3f  val-loss %.4f  val-acc %.3f  lr %.4f  %.1f s"
            % (epoch + 1, args.epochs, logs["loss"], logs["accuracy"], logs["val_loss"], logs["val_accuracy"],
               logs.get("lr", lr), time.time() - self.t0))


if not args.custom_loop:
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9), compression=compression)
    model.compile(optimizer=opt, loss=loss_fn, metrics=["accuracy"])
    model.fit(train_x, train_y, batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(val_x, val_y), verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback(),  # before the callbacks that read metrics
                         hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=args.warmup_epochs),
                         EpochLog()])
    val_acc = model.evaluate(val_x, val_y, verbose=0)[1]  # this rank's share
else:
    opt = keras.optimizers.SGD(lr, momentum=0.9)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        tape = hvd_tf.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss, tf.reduce_mean(tf.cast(tf.argmax(logits, 1) == y, tf.float32))

    data = tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(per_rank, seed=args.seed + hvd.rank())
    data = data.batch(args.batch_size, drop_remainder=True)
    for epoch in range(args.epochs):
        t0 = time.time()
        tot_loss, tot_acc = 0.0, 0.0
        for b, (x, y) in enumerate(data):
            loss, acc = train_step(x, y)
            if b == 0 and epoch == 0:  # rank 0's weights and optimizer state everywhere
                hvd_tf.broadcast_variables(model.variables, root_rank=0)
                hvd_tf.broadcast_variables(opt.variables, root_rank=0)
            tot_loss += float(loss)
            tot_acc += float(acc)
        logits = model(val_x, training=False)
        val = [float(loss_fn(val_y, logits)), float(np.mean(np.argmax(logits, 1) == val_y))]
        train_loss, train_acc, val_loss, val_acc = hvd.allreduce(
            np.array([tot_loss / steps, tot_acc / steps] + val), name="epoch_metrics")
        log("epoch %d/%d  loss %.4f  train-acc %.3f  val-loss %.4f  val-acc %.3f  lr %.4f  %.1f s"
            % (epoch + 1, args.epochs, train_loss, train_acc, val_loss, val_acc, lr, time.time() - t0))
    val_acc = val[1]

val_acc = hvd.allreduce(np.float64(val_acc), name="final_val_acc")  # the job's
if args.checkpoint and hvd.rank() == 0:  # every rank holds the same model: one writer
    model.save(args.checkpoint)
weights = np.concatenate([w.numpy().ravel() for w in model.weights])
same = bool(np.all(hvd.allgather(weights[None]) == weights))
log("RESULT workers=%d val_acc=%.4f identical_weights=%s" % (hvd.size(), val_acc, same))
hvd.shutdown()
