import os, sys, time, threading, tempfile, shutil, cProfile, pstats, io
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _local import start_local_ray
from peers import paced
import actors
from storage import Message
from actors.protocol.connection import IOLoop
start_local_ray()
root = tempfile.mkdtemp()
cluster = actors.start_cluster(namespace="tmpp", nameservers=1, brokers=1, store_root=root,
    topics=[actors.TopicConfig("L", 4, 4)], broker_options={"store": {"flush_disk_type": "ASYNC_FLUSH"}})
producer = cluster.producer("x")
for _ in range(300): producer.send(Message("L", b"x"*100))
sem = threading.Semaphore(0)
def one(i):
    producer.send_async(Message("L", b"x"*100)).add_done_callback(lambda _: sem.release())
paced(1000, 1, one)
for _ in range(1000): sem.acquire()
pm, pio = cProfile.Profile(), cProfile.Profile()
loop = IOLoop.get().loop
ev = threading.Event()
loop.call_soon_threadsafe(lambda: (pio.enable(), ev.set())); ev.wait()
pm.enable()
paced(1000, 3, one)
pm.disable()
for _ in range(3000): sem.acquire()
ev.clear(); loop.call_soon_threadsafe(lambda: (pio.disable(), ev.set())); ev.wait()
for name, p in (("caller", pm), ("io", pio)):
    s = io.StringIO(); st = pstats.Stats(p, stream=s)
    print(f"===== {name}: total {st.total_tt*1e6/3000:.1f} us/msg (profiled)")
    st.sort_stats("tottime").print_stats(28)
    print("\n".join(l for l in s.getvalue().splitlines() if l.strip())[:6000])
producer.close(); cluster.shutdown()
import ray; ray.shutdown(); shutil.rmtree(root, ignore_errors=True)
