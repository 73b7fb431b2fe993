"""The local Spark the Spark suites run on: local[2] (two task slots, one JVM, the executors'
Python workers started with this interpreter, which has kolo and the frameworks)."""

import os
import sys


def local_spark(app):
    """A SparkSession on local[2] for the suite named app; stop() it when done."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    s = (SparkSession.builder.master("local[2]").appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "4")
         # a barrier stage larger than the slots fails at once rather than after 40 checks
         .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
         .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
         .getOrCreate())
    s.sparkContext.setLogLevel("FATAL")
    return s
