# On every node at once: listen on PORT, a port of the ephemeral range that NCCL and gloo
# bind their connections in, and connect to every peer's listener on the same port.
# argv[1]: "PORT LIMIT PEER..." (PEER: a cluster address). Prints "port PORT", "range LOW
# HIGH" (this node's ip_local_port_range), "listen ok|busy|error WHY", then "peer ADDRESS open|
# timeout|refused|error WHY" per peer. A refusal is retried until LIMIT, since a peer's
# listener may still be starting; the listener stays up until every peer has connected,
# or LIMIT + LATE_S have passed (a peer whose probe started later still gets its turn).
import errno
import socket
import sys
import threading
import time

RETRY_S = 0.05
LATE_S = 2.0

port_text, limit_text, *peers = sys.argv[1].split()
port, limit = int(port_text), float(limit_text)
started = time.time()
deadline = started + limit
print("port", port)
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        print("range", *ranges.read().split())
except OSError:
    pass

server = None
try:
    if socket.has_dualstack_ipv6():
        server = socket.create_server(("", port), family=socket.AF_INET6,
                                      dualstack_ipv6=True)
    else:
        server = socket.create_server(("", port))
    print("listen ok")
except OSError as error:
    print("listen", "busy" if error.errno == errno.EADDRINUSE
          else f"error {error.strerror or error}")
sys.stdout.flush()


def accept_peers() -> None:
    server.settimeout(0.1)
    accepted = 0
    while accepted < len(peers) and time.time() < deadline + LATE_S:
        try:
            server.accept()[0].close()
            accepted += 1
        except socket.timeout:  # noqa: UP041 - a node's python may be older than 3.10
            continue
        except OSError:
            break


def reach(peer: str, said: dict) -> None:
    while True:
        try:
            socket.create_connection((peer, port),
                                     timeout=max(0.1, deadline - time.time())).close()
            said[peer] = "open"
        except socket.timeout:  # noqa: UP041 - TimeoutError only from Python 3.10 on
            said[peer] = "timeout"
        except ConnectionRefusedError:
            if time.time() + RETRY_S < deadline:
                time.sleep(RETRY_S)
                continue
            said[peer] = "refused"
        except OSError as error:
            said[peer] = f"error {error.strerror or error}"
        return


listener = threading.Thread(target=accept_peers, daemon=True) if server else None
if listener:
    listener.start()
said: dict = {}
threads = [threading.Thread(target=reach, args=(peer, said), daemon=True) for peer in peers]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(limit + 1)
for peer in peers:
    print("peer", peer, said.get(peer, "timeout"))
sys.stdout.flush()
if listener:
    listener.join(max(0.0, deadline + LATE_S - time.time()))
