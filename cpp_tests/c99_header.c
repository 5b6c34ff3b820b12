/* Compiled as strict C99 with -Wall -Wextra -Wpedantic -Werror: the header is plain C. */
#include "muon_opt.h"

#include <string.h>

int muon_c99_config_roundtrip(void) {
    muon_config_t from_macro = MUON_CONFIG_INIT;
    muon_config_t from_call;
    memset(&from_call, 0xAB, sizeof from_call);
    muon_config_init(&from_call);
    if (muon_config_validate(&from_macro) != MUON_STATUS_SUCCESS) return 1;
    if (muon_config_validate(&from_call) != MUON_STATUS_SUCCESS) return 2;
    if (from_macro.struct_size != from_call.struct_size) return 3;
    if (muon_get_version() != MUON_VERSION_CODE) return 4;
    return 0;
}

/* Teardown may drop the destroy status: no warning under -Werror (GCC's warn_unused_result,
   unlike [[nodiscard]], ignores a (void) cast, so the destroy calls carry no MUON_NODISCARD). */
void muon_c99_teardown(muon_optimizer_t *opt, muon_comm_t *comm) {
    (void)muon_optimizer_destroy(opt);
    (void)muon_comm_destroy(comm);
    muon_optimizer_destroy(NULL);
}
