/* Jupyter wire-protocol decoding in cove-kernel (src/kernel/wire.c): a sandboxed kernel
 * controls every byte it sends. Frames are split at 0xff bytes of the input; half the inputs
 * are checked under a key, half with none (the spec's "no authentication"). */
#include <stdint.h>
#include <string.h>

#include "kernel/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *key = data[0] & 1 ? "a-key" : "";
    data++;
    size--;
    struct wire_frame frames[16];
    size_t count = 0, start = 0;
    for (size_t i = 0; i <= size && count < 16; i++) {
        if (i == size || data[i] == 0xff) {
            frames[count++] = (struct wire_frame){.data = data + start, .len = i - start};
            start = i + 1;
        }
    }
    struct wire_message message;
    struct cove_error *err = NULL;
    if (wire_decode(key, frames, count, &message, &err) == 0) {
        if (message.msg_type == NULL || message.parent_id == NULL)
            __builtin_trap();
        wire_message_release(&message);
    }
    cove_error_free(err);
    return 0;
}
