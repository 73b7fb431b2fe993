"""kolo._elastic_task: a worker of an elastic job whose function lives in a driver's process
(kolo.ray.ElasticRayExecutor.run, kolo.spark.run_elastic; kolo/_elastic_driver.py).

kolorun starts `python3 -m kolo._elastic_task` as each worker, here or on another host. It
fetches the pickled function from the driver's service (its port KOLO_DRIVER_SERVICE, secret
KOLO_DRIVER_KEY, at the host of KOLO_RENDEZVOUS: the driver's machine runs kolorun, whose store the
worker reaches there), calls it, and sends back what it returned with this worker's rank and
round. The function does what a script under `kolorun --min-np` does: kolo.init(), then a
training loop under kolo.elastic.run. A function that raises makes the worker exit 1 after its
traceback (kolorun counts a failed worker, and the job goes on without it); a worker that
kolorun removed exits 0 and returns nothing.
"""

import json
import os
import pickle
import sys
import traceback

from kolo import _relay


def _service():
    """(host, port, key) of the driver's service."""
    rdv = os.environ.get("KOLO_RENDEZVOUS", "")
    host = rdv.rsplit(":", 1)[0].strip("[]") if ":" in rdv else ""
    port, key = os.environ.get("KOLO_DRIVER_SERVICE"), os.environ.get("KOLO_DRIVER_KEY")
    if not host or not port or not key:
        raise SystemExit("kolo: this program is a worker of an elastic job's driver (kolorun starts it, with "
                         "KOLO_RENDEZVOUS, KOLO_DRIVER_SERVICE and KOLO_DRIVER_KEY); it is not run by hand")
    return host, int(port), key


def request(op, payload=None, **fields):
    """One exchange with the driver's service: returns the DATA frame's bytes it answers with
    (None when it answers with nothing)."""
    host, port, key = _service()
    s = _relay.connect(host, port)
    try:
        _relay.send_json(s, _relay.HELLO, dict(fields, key=key, op=op))
        if payload is not None:
            _relay.send(s, _relay.DATA, payload)
        kind, body = _relay.recv(s)
        if kind == _relay.REPLY:
            err = json.loads(body).get("error")
            if err:
                raise RuntimeError("kolo: the driver refused %s: %s" % (op, err))
            return None
        if kind != _relay.DATA:
            raise RuntimeError("kolo: the driver's service answered %s with %r" % (op, kind))
        return body
    finally:
        s.close()


def _where():
    import kolo
    if kolo.is_initialized():
        return kolo.rank(), kolo.elastic_round()
    return None, None


def main():
    try:
        fn = pickle.loads(request("fn"))
    except (OSError, _relay.WireError, RuntimeError) as e:
        host, port, _ = _service()
        sys.stderr.write("kolo: worker %s cannot get its function from the driver at %s:%d: %s\n"
                         % (os.environ.get("KOLO_ELASTIC_ID", "?"), host, port, e))
        return 1
    try:
        value = fn()
    except SystemExit:
        raise
    except BaseException:  # noqa: B902 - the worker's failure, whatever it is, ends it with its traceback
        import kolo
        rank = kolo.rank() if kolo.is_initialized() else None
        sys.stderr.write("kolo: worker %s (rank %s) failed:\n" % (os.environ.get("KOLO_ELASTIC_ID", "?"), rank))
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    rank, rnd = _where()
    try:
        data = pickle.dumps(value)
    except Exception as e:  # noqa: BLE001 - any pickling failure is the value's
        sys.stderr.write("kolo: worker_fn's return value cannot be sent to the driver: %s\n" % e)
        return 1
    request("result", data, worker=os.environ.get("KOLO_ELASTIC_ID"), rank=rank, round=rnd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
