# From a node, connect to the head's rendezvous port: argv HOST PORT TIMEOUT. Prints open,
# timeout (a DROP), refused (a REJECT, or nothing listening) or error; "refused" is
# retried until the deadline, since the listener may still be starting.
import socket
import sys
import time

host, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.time() + limit
while True:
    try:
        socket.create_connection((host, port), timeout=max(0.1, deadline - time.time())).close()
        print("open")
    except TimeoutError:
        print("timeout")
    except ConnectionRefusedError:
        if time.time() + 0.2 < deadline:
            time.sleep(0.2)
            continue
        print("refused")
    except OSError as error:
        print("error", error.strerror or error)
    break
