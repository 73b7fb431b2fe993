/* hmap.c - an intrusive hash map from (string, tag) to the object that embeds the node. */
#include "internal.h"

uint64_t kolo__hash(const char *s, int tag)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uint32_t)tag;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h ^ (h >> 29);
}

int kolo__hmap_init(kolo__hmap *m, size_t nb)
{
    m->count = 0;
    m->nb = nb;
    m->b = kolo__calloc(nb, sizeof(*m->b));
    if (!m->b) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for an engine hash table");
    return KOLO_OK;
}

void kolo__hmap_free(kolo__hmap *m)
{
    kolo__free(m->b);
    m->b = NULL;
    m->nb = m->count = 0;
}

kolo__hnode *kolo__hmap_get(const kolo__hmap *m, const char *key, int tag, uint64_t hash)
{
    if (!m->nb) return NULL;
    for (kolo__hnode *n = m->b[hash & (m->nb - 1)]; n; n = n->next)
        if (n->hash == hash && n->tag == tag && strcmp(n->key, key) == 0) return n;
    return NULL;
}

static void grow(kolo__hmap *m)
{
    size_t nb = m->nb * 4;
    kolo__hnode **b = kolo__calloc(nb, sizeof(*b));
    if (!b) return; /* longer chains, still correct */
    for (size_t i = 0; i < m->nb; i++) {
        kolo__hnode *n = m->b[i];
        while (n) {
            kolo__hnode *next = n->next;
            n->next = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
            n = next;
        }
    }
    kolo__free(m->b);
    m->b = b;
    m->nb = nb;
}

void kolo__hmap_put(kolo__hmap *m, kolo__hnode *n, const char *key, int tag, uint64_t hash)
{
    n->key = key;
    n->tag = tag;
    n->hash = hash;
    if (m->count >= m->nb * 2) grow(m);
    kolo__hnode **head = &m->b[hash & (m->nb - 1)];
    n->next = *head;
    *head = n;
    m->count++;
}

void kolo__hmap_del(kolo__hmap *m, kolo__hnode *n)
{
    kolo__hnode **p = &m->b[n->hash & (m->nb - 1)];
    while (*p && *p != n) p = &(*p)->next;
    if (*p) {
        *p = n->next;
        m->count--;
    }
    n->next = NULL;
}
